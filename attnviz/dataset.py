"""Attention over a whole folder of photos: one Parquet row per (image, layer, head).

Data flows one way, the same on one machine and on a Ray cluster (:mod:`attnviz.dataset_ray`):

    (path, bytes) → checked image (read_photo) → capture, one forward per photo → captures
                  → per-head statistics → Arrow ``records`` (one row per file) → Parquet tables

:func:`analyse` is the plain per-batch function: it takes a loaded model and a list of (path, bytes)
and returns the records of that batch. Both engines call it; Ray only schedules it.

A run folder ``OUT`` holds

- ``run.json``: what was run (model, input size, fit); a rerun into the same folder must match it;
- ``heads/part-*.parquet``: one row per (image, layer, head), layers and heads 0-based as in
  :class:`attnviz.Capture` — CLS entropy (nats), mean attention distance (px of the model input),
  prefix share, the most-attended patch and the fraction of patches holding 60 % of the class
  token's mass over the patches (DINO's mass mask, :func:`attnviz.masks.mass_mask`), and the grid the
  patch lies on (``keys_grid_h``, ``keys_grid_w``). A model with stages (Swin, PiT, …) has each layer's
  own head count and grids there (:mod:`attnviz.stage_stats` says what each statistic is);
- ``images/part-*.parquet``: one row per image used (size, format, grid, top-5 for classifiers);
- ``errors/part-*.parquet``: one row per file that could not be used, with the reason;
- ``captures/<digest>.*`` with ``--store qk``: each image's exact compact capture.

Each batch's parts are written to hidden temporary files first, then renamed heads → errors → images
with Ctrl-C held off until the last rename, so a batch lands whole; a file counts as done once its
images or errors row is on disk. A batch cut short anyway (the process killed between two renames)
leaves a heads part without its images part: a rerun removes it before it redoes that batch, so the
``heads`` folder, read by any Parquet reader, holds exactly one row per (image, layer, head).

Photos are read only after ``stat`` says they are regular files of at most 50 MB
(:func:`attnviz.runfiles.read_file`): a FIFO, a device, a dangling or looping link, a 3 GB file each get
an errors row with the reason, without a byte read. The Dataset page reads run folders back through
:func:`attnviz.runfiles.open_run`, which checks every file first.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

import attnviz.runfiles as runfiles
from .errors import ExportError, RunError, RunFileError
from .capture import Capture, capture
from .images import MAX_BYTES as MAX_PHOTO_BYTES
from .images import ImageError
from .photos import read_photo
from .models import Fit, Model, load_model
from .stage_stats import head_values  # the per-head columns: each layer at its own grids

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
TABLES = ("heads", "images", "errors")
Store = Literal["none", "qk"]

# One row per input file, as the per-batch function returns it. The per-head values of an image are
# lists of length L · H in (layer, head) order; :func:`split` turns them into one row per head.
RECORDS = pa.schema([
    ("path", pa.string()),
    ("digest", pa.string()),  # sha256 of the file's bytes; null when the file could not be read
    ("error_key", pa.string()),  # null for an image that was used; else the reason's catalogue key
    ("error", pa.string()),  # one English sentence
    ("error_values", pa.string()),  # JSON: the values that fill the sentence in another language
    ("width", pa.int32()),  # the upright photo, before the model's resize
    ("height", pa.int32()),
    ("format", pa.string()),
    ("input_size", pa.int32()),  # S: the model saw S × S pixels
    ("grid_h", pa.int32()),
    ("grid_w", pa.int32()),
    ("num_prefix_tokens", pa.int32()),
    ("seconds", pa.float64()),  # this image's share of its batch's forward pass
    ("top5_labels", pa.list_(pa.string())),  # null without a classifier head
    ("top5_probs", pa.list_(pa.float64())),
    ("layer", pa.list_(pa.int32())),
    ("head", pa.list_(pa.int32())),
    ("entropy", pa.list_(pa.float64())),
    ("distance_px", pa.list_(pa.float64())),
    ("prefix_share", pa.list_(pa.float64())),
    ("top_patch", pa.list_(pa.int32())),
    ("mass60_fraction", pa.list_(pa.float64())),
    ("keys_grid_h", pa.list_(pa.int32())),  # the keys' grid of the row's layer: where top_patch lies
    ("keys_grid_w", pa.list_(pa.int32())),
])
HEAD_COLUMNS = ("layer", "head", "entropy", "distance_px", "prefix_share", "top_patch", "mass60_fraction",
                "keys_grid_h", "keys_grid_w")
IMAGE_COLUMNS = ("path", "digest", "width", "height", "format", "input_size", "grid_h", "grid_w",
                 "num_prefix_tokens", "seconds", "top5_labels", "top5_probs")
ERROR_COLUMNS = ("path", "digest", "error_key", "error", "error_values")


@dataclass(frozen=True)
class RunConfig:
    """Everything that decides a run's numbers; written to ``run.json`` and checked on a rerun."""

    model: str | None = None  # timm name; None for the offline default
    size: int | None = None
    checkpoint: str | None = None
    fit: Fit = "crop"
    store: Store = "none"

    def load(self, device: str | None = "cpu") -> Model:
        return load_model(self.model, self.size, checkpoint=self.checkpoint, device=device)


# --- Which files -------------------------------------------------------------------------------

def list_images(source: str | Path) -> list[str]:
    """Absolute paths of the photos in a folder (recursively, by suffix, sorted), or of a list file.

    In a folder, every name with a photo's suffix that is not a folder is listed — links that lead
    nowhere, FIFOs and devices too, so that each gets an errors row saying why instead of vanishing.
    A list file (UTF-8, at most 256 MB) has one path a line (relative ones are relative to the list
    file; blank lines and lines starting with ``#`` are skipped). Listed files are kept whatever their
    suffix, so a bad one gets an errors row too. Raises :class:`RunError` when ``source`` is neither.
    """
    source = Path(source)
    if source.is_dir():
        found = (p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir())
        return sorted(os.path.abspath(p) for p in found)
    if not source.exists():
        raise RunError(f"{source} does not exist; name a folder of photos or a list file (one path a line).")
    try:
        text = runfiles.read_file(source, runfiles.MAX_LIST_BYTES, str(source)).decode("utf-8")
    except RunFileError as e:
        raise RunError(f"{e} Name a folder of photos or a list file (one path a line).") from None
    except UnicodeDecodeError as e:
        raise RunError(f"{source} is not a UTF-8 text file (byte {e.start} is not UTF-8); a list file "
                       "has one path a line, saved as UTF-8.") from None
    names = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return list(dict.fromkeys(os.path.abspath(source.parent / name) for name in names))


def read_items(paths: Sequence[str]) -> list[tuple[str, bytes | RunFileError]]:
    """(path, bytes) per path, or (path, why not) for one that is not a regular file of at most 50 MB.

    Each file is ``stat``-ed before it is opened (a FIFO is never opened, a device or a 3 GB file never
    read) and read through the descriptor that was checked; both engines read files here.
    """
    items: list[tuple[str, bytes | RunFileError]] = []
    for path in paths:
        try:
            items.append((path, runfiles.read_file(path, MAX_PHOTO_BYTES, path)))
        except RunFileError as e:
            items.append((path, e))
    return items


# --- The per-batch function ---------------------------------------------------------------------

def _error_record(path: str, digest: str | None, key: str, message: str, values: dict) -> dict:
    return {"path": path, "digest": digest, "error_key": key, "error": message,
            "error_values": json.dumps(values, ensure_ascii=False, default=str)}


def analyse(
    model: Model,
    items: Iterable[tuple[str, bytes | RunFileError | OSError]],
    fit: Fit = "crop",
    save: Save | None = None,
    captures: Path | None = None,
) -> pa.Table:
    """The per-batch function: (path, bytes) pairs → one :data:`RECORDS` row per pair.

    Files that cannot be read or decoded become error rows; the others are captured one forward pass
    each (several images per forward measured no faster on a 2-core CPU: 73 vs 75 ms per photo, and a
    capture records per-image token norms). With ``save`` each capture is also written to
    ``captures/<digest>.npz``.
    """
    rows: list[dict] = []
    for path, data in items:
        if isinstance(data, RunFileError):  # not a regular file, too large, gone: said without reading it
            rows.append(_error_record(path, None, data.key, str(data), data.values))
            continue
        if isinstance(data, OSError):
            reason = data.strerror or type(data).__name__
            rows.append(_error_record(path, None, "not_read", f"{path} could not be read: {reason}.",
                                      {"name": path, "reason": reason}))
            continue
        digest = hashlib.sha256(data).hexdigest()
        try:
            checked = read_photo(data, model, path)  # decoded as the page and the export CLI decode it
            cap = capture(model, checked.image, fit)
        except ImageError as e:
            rows.append(_error_record(path, digest, e.key, str(e), e.values))
            continue
        except ValueError as e:  # Model.view refuses pictures it cannot resize
            rows.append(_error_record(path, digest, "unusable", f"{path}: {e}.", {"name": path, "reason": str(e)}))
            continue
        top = model.top_classes(cap.output)
        grid = cap.grid  # the first layer's
        if save is not None and captures is not None:
            save(cap, captures / f"{digest}.npz", path, checked.image.size)
        rows.append({
            "path": path, "digest": digest, "width": checked.image.width, "height": checked.image.height,
            "format": checked.format, "input_size": int(cap.input.shape[-1]), "grid_h": grid[0],
            "grid_w": grid[1], "num_prefix_tokens": cap.num_prefix_tokens, "seconds": cap.seconds,
            "top5_labels": [label for label, _ in top] if top else None,
            "top5_probs": [p for _, p in top] if top else None,
            **{name: values.tolist() for name, values in head_values(cap).items()},
        })
    return pa.Table.from_pylist(rows, schema=RECORDS)


# --- Records → the three tables -----------------------------------------------------------------

@dataclass(frozen=True)
class Tables:
    heads: pa.Table  # one row per (image, layer, head)
    images: pa.Table  # one row per image used
    errors: pa.Table  # one row per file that could not be used

    def __len__(self) -> int:
        return self.images.num_rows + self.errors.num_rows


def split(records: pa.Table) -> Tables:
    """One row per file → one row per (image, layer, head), per image and per error."""
    import pyarrow.compute as pc

    records = records.select(RECORDS.names).cast(RECORDS)  # whatever a transport did to the types
    failed = pc.is_valid(records["error_key"])
    used = records.filter(pc.invert(failed))
    parents = pc.list_parent_indices(used["layer"])  # (rows,): the image each head row comes from
    heads = {"path": pc.take(used["path"], parents), "digest": pc.take(used["digest"], parents)}
    heads |= {name: pc.list_flatten(used[name]) for name in HEAD_COLUMNS}
    return Tables(
        heads=pa.table(heads),
        images=used.select(IMAGE_COLUMNS),
        errors=records.filter(failed).select(ERROR_COLUMNS),
    )


def missing_errors(paths: Iterable[str]) -> pa.Table:
    """Records for files an engine never returned (a worker lost them): said as missing, to be redone."""
    rows = []
    for p in paths:
        e = runfiles.problem("file_missing", name=p)
        rows.append(_error_record(p, None, e.key, str(e), e.values))
    return pa.Table.from_pylist(rows, schema=RECORDS)


# --- The run folder ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RunFolder:
    path: Path

    @property
    def captures(self) -> Path:
        return self.path / "captures"

    def check(self, config: RunConfig) -> None:
        """That the folder can hold this run: a folder (or nothing yet), and if it holds a run, one with
        the same settings. Cheap, so the engines call it before they load the model."""
        if self.path.exists() and not self.path.is_dir():
            raise RunError(f"{self.path} is a file, not a folder; name a folder for the run's tables "
                           "(it is created if missing).")
        meta = self.path / "run.json"
        if not (meta.exists() or meta.is_symlink()):
            return
        before = runfiles.read_info(meta, str(meta)).settings
        changed = [k for k, v in before.items() if getattr(config, k) != v]
        if changed:
            raise RunError(f"{self.path} holds a run with other settings ({', '.join(changed)}); "
                           "use another --out folder or the same settings.")

    def start(self, config: RunConfig, model_name: str) -> None:
        """Create the folder, or check that a rerun uses the same settings as the run it continues and
        tidy what an interrupted run left (:meth:`tidy`)."""
        self.check(config)
        info = {**dataclasses.asdict(config), "model_name": model_name}
        meta = self.path / "run.json"
        try:
            for name in (*TABLES, *(("captures",) if config.store == "qk" else ())):
                (self.path / name).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunError(f"cannot create the run folder {self.path}: {e.strerror or e}.") from None
        if meta.exists():
            self.tidy()
        else:
            _atomic(meta, lambda tmp: tmp.write_text(json.dumps(info, indent=2), encoding="utf-8"))

    def tidy(self) -> None:
        """Remove what a run cut short left: temporary files, and heads parts whose batch never got its
        images part (that batch is redone, and its rows would be on disk twice)."""
        images = runfiles.parts(self.path, "images")
        for name in (*TABLES, "captures"):
            folder = self.path / name
            for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
                tmp.unlink(missing_ok=True)
        for stem, part in runfiles.parts(self.path, "heads").items():
            if stem not in images:
                part.unlink(missing_ok=True)

    def config(self) -> runfiles.RunInfo:
        """The run's ``run.json``, checked (:func:`attnviz.runfiles.read_info`)."""
        return runfiles.read_info(self.path / "run.json")

    def done(self) -> set[str]:
        """Paths that already have an images or errors row."""
        seen: set[str] = set()
        for name in ("images", "errors"):
            for stem, part in runfiles.parts(self.path, name).items():
                table = runfiles.read_part(part, name, f"{name}/{stem}.parquet", ("path",))
                seen.update(table["path"].to_pylist())
        return seen

    def write(self, records: pa.Table) -> Tables:
        """Append one batch's records as a part of each table: written to temporary files, then renamed
        heads → errors → images (images/errors mark it done) with Ctrl-C held off until the last."""
        tables = split(records)
        stem = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        written: list[tuple[Path, Path]] = []
        try:
            for name in ("heads", "errors", "images"):
                table = getattr(tables, name)
                if table.num_rows:
                    target = self.path / name / f"{stem}.parquet"
                    tmp = _temporary(target)
                    written.append((tmp, target))
                    pq.write_table(table, tmp)
            with _uninterrupted():
                for tmp, target in written:
                    os.replace(tmp, target)
        finally:
            for tmp, _ in written:
                tmp.unlink(missing_ok=True)
        return tables


def _temporary(target: Path) -> Path:
    """A hidden name beside ``target``: Parquet readers (pyarrow.dataset, Spark, DuckDB) skip names
    starting with a dot, so they never see half a part."""
    return target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")


@contextlib.contextmanager
def _uninterrupted():
    """Hold off Ctrl-C (SIGINT) and SIGTERM until the block ends, then deliver them: a batch's renames
    land together. (A signal mask would not do: the kernel hands a process's signal to any thread that
    does not block it, and torch keeps several.) Only the main thread can catch signals; elsewhere it
    does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not None]
    before = {s: signal.signal(s, lambda number, _frame: caught.append(number)) for s in held}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
        if caught:
            signal.raise_signal(caught[0])  # now handled as it would have been: KeyboardInterrupt for Ctrl-C


def _atomic(target: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary name and rename: a reader never sees half a file."""
    tmp = _temporary(target)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def read_run(out: str | Path) -> Tables:
    """The three tables of a run folder, each sorted; heads rows of unfinished batches left out."""
    import pyarrow.compute as pc

    out = Path(out)
    empty = split(pa.Table.from_pylist([], schema=RECORDS))

    def read(name: str) -> pa.Table:
        parts = sorted((out / name).glob("part-*.parquet"))
        like = getattr(empty, name)
        return pa.concat_tables([pq.read_table(p).cast(like.schema) for p in parts]) if parts else like

    images, errors = read("images"), read("errors")
    # A rerun of an interrupted batch writes its heads again: keep the rows of finished images, once.
    images = _unique(images, ["path"])
    heads = read("heads")
    heads = _unique(heads.filter(pc.is_in(heads["path"], images["path"])), ["path", "layer", "head"])
    return Tables(
        heads=heads.sort_by([("path", "ascending"), ("layer", "ascending"), ("head", "ascending")]),
        images=images.sort_by("path"),
        errors=_unique(errors, ["path"]).sort_by("path"),
    )


def _unique(table: pa.Table, keys: list[str]) -> pa.Table:
    """The first row of each key (reruns may repeat rows of a batch whose last part never landed)."""
    if table.num_rows == 0:
        return table
    index = pa.array(np.arange(table.num_rows))
    first = table.append_column("_row", index).group_by(keys, use_threads=False).aggregate([("_row", "min")])
    return table.take(pa.array(np.sort(first["_row_min"].to_numpy())))


# --- The local engine ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Summary:
    listed: int  # files in the source
    skipped: int  # already done by an earlier run
    images: int  # used in this run
    errors: int  # could not be used in this run
    seconds: float
    first_seconds: float = 0.0  # until the first batch landed: start-up (Ray, model loads) and one batch
    first_files: int = 0  # files in that first batch

    @property
    def images_per_second(self) -> float:
        return (self.images + self.errors) / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_per_second(self) -> float:
        """Files per second after the first batch: the rate once everything has started."""
        rest = self.seconds - self.first_seconds
        return (self.images + self.errors - self.first_files) / rest if rest > 0 else 0.0


Save = Callable[[Capture, Path, str, tuple[int, int]], None]  # (capture, file, source path, photo size)


def saver(store: Store, model: Model, checkpoint: str | None = None) -> Save | None:
    """How ``--store`` writes one capture: ``qk`` is :mod:`attnviz.export`'s compact exact format."""
    if store == "none":
        return None
    from .export import describe, save_capture, weights_file

    weights = weights_file(model, checkpoint)  # the weights file's sha256: once per run, not per image

    def save(cap: Capture, target: Path, source: str, source_size: tuple[int, int]) -> None:
        about = describe(model, cap, source=source, weights=weights, source_size=source_size)
        _atomic(target, lambda tmp: save_capture(tmp, cap, format="qk", about=about, labels=model.labels))

    return save


def run_local(
    source: str | Path,
    out: str | Path,
    config: RunConfig = RunConfig(),
    batch: int = 4,
    progress: bool = True,
    model: Model | None = None,
) -> Summary:
    """Analyse every photo of ``source`` not yet done in ``out``, ``batch`` images per part file."""
    from tqdm import tqdm

    start = time.perf_counter()
    paths = list_images(source)
    folder = RunFolder(Path(out))
    folder.check(config)  # a file in the way or other settings are said before the model loads
    model = model if model is not None else config.load()
    folder.start(config, model.public_name)  # shown on the Dataset page: no server path
    done = folder.done()
    pending = [p for p in paths if p not in done]
    save = saver(config.store, model, config.checkpoint)
    images = errors = 0
    first: tuple[float, int] = (0.0, 0)
    with tqdm(total=len(pending), unit="image", disable=not progress) as bar:
        for i in range(0, len(pending), batch):
            chunk = pending[i : i + batch]
            tables = folder.write(analyse(model, read_items(chunk), config.fit, save, folder.captures))
            images, errors = images + tables.images.num_rows, errors + tables.errors.num_rows
            first = first if i else (time.perf_counter() - start, len(tables))
            bar.update(len(chunk))
    return Summary(len(paths), len(paths) - len(pending), images, errors, time.perf_counter() - start, *first)


# --- Reading runs back (the Dataset page, notebooks) ---------------------------------------------

# How the page ranks a head's images: (column, smallest first). "local": the patches attend nearby
# (small mean distance); "focused": the class token's mass sits on few patches (usually the object).
RANKINGS = {"local": ("distance_px", True), "focused": ("mass60_fraction", True)}


MAX_RUNS = 200  # run folders the page lists


def find_runs(root: str | Path) -> list[Path]:
    """The run folders (those with a ``run.json``, whatever it holds) at ``root`` and one level below it,
    sorted by name; at most :data:`MAX_RUNS`. A broken ``run.json`` is listed so that the page can say
    what is wrong with it (:func:`attnviz.runfiles.open_run`)."""
    root = Path(root)

    def is_run(folder: Path) -> bool:
        return os.path.lexists(folder / "run.json")

    try:
        below = sorted(entry for entry in root.iterdir() if entry.is_dir() and is_run(entry))
    except OSError:  # not a folder, or not readable
        return []
    return ([root] if is_run(root) else []) + below[:MAX_RUNS]


def head_summary(heads):
    """(pandas) one row per (layer, head): the mean of each statistic over the images, and their count."""
    stats = ["entropy", "distance_px", "prefix_share", "mass60_fraction"]
    summary = heads.groupby(["layer", "head"], as_index=False)[stats].mean()
    return summary.assign(images=heads.groupby(["layer", "head"]).size().to_numpy())


def extremes(heads, layer: int, head: int, ranking: str, count: int = 6):
    """(pandas) the ``count`` images where head (``layer``, ``head``) ranks first by ``RANKINGS[ranking]``;
    ties in path order (``heads`` from :func:`read_run`, or from :func:`attnviz.runfiles.open_run`, whose
    ``image`` numbers the photos in path order)."""
    column, smallest_first = RANKINGS[ranking]
    rows = heads[(heads["layer"] == layer) & (heads["head"] == head)]
    tie = "path" if "path" in heads.columns else "image"
    return rows.sort_values([column, tie], ascending=[smallest_first, True]).head(count)


def reopen(model: Model, path: str, digest: str, fit: Fit, captures: Path | None = None) -> tuple[Image.Image, Capture]:
    """An image of a run again: the S × S picture the model saw, and its capture — the stored one when
    the run kept captures (``--store qk``) and it is usable for ``model``, else a fresh capture of the file.

    The file is read only if it is a regular file of at most 50 MB. Raises :class:`RunFileError` when it
    is not (or is gone), :class:`RunError` when its bytes changed since the run, :class:`ImageError` when
    it is no picture the model can take.
    """
    data = runfiles.read_file(path, MAX_PHOTO_BYTES, Path(path).name)
    if hashlib.sha256(data).hexdigest() != digest:
        raise RunError(f"{Path(path).name} has changed since the run.")
    checked = read_photo(data, model, Path(path).name)  # its sentences name the file, not where it is
    view = model.view(checked.image, fit)
    stored = _stored_capture(captures / f"{digest}.npz", model) if captures is not None else None
    return view, stored if stored is not None else capture(model, checked.image, fit)


def _stored_capture(path: Path, model: Model) -> Capture | None:
    """A run's stored capture, when it is a regular file of bounded size, an export attnviz reads, and of
    ``model``'s layout; otherwise None (the caller captures afresh: same numbers, more time)."""
    from .export import load_capture

    try:
        runfiles.check_file(path, runfiles.MAX_CAPTURE_BYTES, path.name)
        with zipfile.ZipFile(path) as archive:  # the sizes its arrays declare, before any is read
            if sum(member.file_size for member in archive.infolist()) > runfiles.MAX_CAPTURE_BYTES:
                return None
        cap = load_capture(path)
    except (RunFileError, ExportError, zipfile.BadZipFile, OSError, ValueError, KeyError, TypeError):
        return None
    fits = [(lay.grid, lay.keys_grid, lay.num_heads) for lay in cap.layouts] == [
        (lay.grid, lay.keys_grid, lay.num_heads) for lay in model.layouts]
    return cap if fits and cap.input.shape[-1] == model.size else None
