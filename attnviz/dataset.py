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
  token's mass over the patches (DINO's mass mask, :func:`attnviz.masks.mass_mask`);
- ``images/part-*.parquet``: one row per image used (size, format, grid, top-5 for classifiers);
- ``errors/part-*.parquet``: one row per file that could not be used, with the reason;
- ``captures/<digest>.*`` with ``--store qk``: each image's exact compact capture.

Each batch's parts are written heads → errors → images, each atomically (a temporary file renamed),
and a file counts as done once its images or errors row is on disk: a rerun skips it, and heads rows
of a batch that never got its images part are ignored by :func:`read_run`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from .errors import RunError
from .capture import Capture, capture
from .images import ImageError
from .photos import read_photo
from .masks import DEFAULT_MASS, mass_mask
from .models import Fit, Model, load_model
from .stats import head_stats

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
])
HEAD_COLUMNS = ("layer", "head", "entropy", "distance_px", "prefix_share", "top_patch", "mass60_fraction")
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

    A list file has one path a line (relative ones are relative to the list file; blank lines and lines
    starting with ``#`` are skipped). Listed files are kept whatever their suffix, so a bad one gets
    an errors row instead of vanishing.
    """
    source = Path(source)
    if source.is_dir():
        found = (p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        return sorted(os.path.abspath(p) for p in found)
    if source.is_file():
        lines = source.read_text(encoding="utf-8").splitlines()
        names = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        return list(dict.fromkeys(os.path.abspath(source.parent / name) for name in names))
    raise FileNotFoundError(f"{source} is neither a folder of photos nor a list file")


def read_items(paths: Sequence[str]) -> list[tuple[str, bytes | OSError]]:
    """(path, bytes) per path, or (path, the error) for a file that cannot be read."""
    items: list[tuple[str, bytes | OSError]] = []
    for path in paths:
        try:
            items.append((path, Path(path).read_bytes()))
        except OSError as e:
            items.append((path, e))
    return items


# --- The per-batch function ---------------------------------------------------------------------

def summary_maps(cap: Capture, layer: int) -> np.ndarray:
    """(H, h, w): every head's one-picture summary of ``layer`` — the class token's row over the patches
    (one ``layer_rows`` call for all heads, the same numbers as ``cls_map``), or, for a model without a
    class token, the capture's own stated alternative (``summary_map``)."""
    if getattr(cap, "has_class_token", True):
        rows = cap.layer_rows(layer, 0).cpu().numpy()  # (H, N): the class token's row in every head
        return rows[:, cap.num_prefix_tokens :].reshape(cap.num_heads, *cap.grid)
    return np.stack([cap.summary_map(layer, head) for head in range(cap.num_heads)])


def head_values(cap: Capture, mass: float = DEFAULT_MASS) -> dict[str, np.ndarray]:
    """Per (layer, head), flattened in that order: the statistics of one image's capture, each (L · H,)."""
    stats = head_stats(cap)  # entropy, distance, prefix share: (L, H)
    shape = (cap.num_layers, cap.num_heads)
    top = np.zeros(shape, dtype=np.int32)
    held = np.zeros(shape, dtype=np.float64)
    for layer in range(cap.num_layers):
        for head, grid_map in enumerate(summary_maps(cap, layer)):  # (h, w) each
            top[layer, head] = int(np.argmax(grid_map))  # raster order: row · w + column
            held[layer, head] = mass_mask(grid_map, mass).count / grid_map.size
    layers, heads = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    return {
        "layer": layers.ravel().astype(np.int32), "head": heads.ravel().astype(np.int32),
        "entropy": stats.entropy.ravel(), "distance_px": stats.distance.ravel(),
        "prefix_share": stats.prefix_share.ravel(), "top_patch": top.ravel(), "mass60_fraction": held.ravel(),
    }


def _error_record(path: str, digest: str | None, key: str, message: str, values: dict) -> dict:
    return {"path": path, "digest": digest, "error_key": key, "error": message,
            "error_values": json.dumps(values, ensure_ascii=False, default=str)}


def analyse(
    model: Model,
    items: Iterable[tuple[str, bytes | OSError]],
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
        if save is not None and captures is not None:
            save(cap, captures / f"{digest}.npz", path, checked.image.size)
        rows.append({
            "path": path, "digest": digest, "width": checked.image.width, "height": checked.image.height,
            "format": checked.format, "input_size": int(cap.input.shape[-1]), "grid_h": cap.grid[0],
            "grid_w": cap.grid[1], "num_prefix_tokens": cap.num_prefix_tokens, "seconds": cap.seconds,
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
    """Records for files an engine never saw (vanished between listing and reading)."""
    rows = [_error_record(p, None, "not_read", f"{p} could not be read: it was not found.",
                          {"name": p, "reason": "not found"}) for p in paths]
    return pa.Table.from_pylist(rows, schema=RECORDS)


# --- The run folder ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RunFolder:
    path: Path

    @property
    def captures(self) -> Path:
        return self.path / "captures"

    def start(self, config: RunConfig, model_name: str) -> None:
        """Create the folder, or check that a rerun uses the same settings as the run it continues."""
        info = {**dataclasses.asdict(config), "model_name": model_name}
        meta = self.path / "run.json"
        if meta.exists():
            before = json.loads(meta.read_text(encoding="utf-8"))
            changed = [k for k in ("model", "size", "checkpoint", "fit", "store") if before.get(k) != info[k]]
            if changed:
                raise RunError(f"{self.path} holds a run with other settings ({', '.join(changed)}); "
                               "use another --out folder or the same settings.")
        for name in (*TABLES, *(("captures",) if config.store == "qk" else ())):
            (self.path / name).mkdir(parents=True, exist_ok=True)
        if not meta.exists():
            _atomic(meta, lambda tmp: tmp.write_text(json.dumps(info, indent=2), encoding="utf-8"))

    def config(self) -> dict:
        return json.loads((self.path / "run.json").read_text(encoding="utf-8"))

    def done(self) -> set[str]:
        """Paths that already have an images or errors row."""
        seen: set[str] = set()
        for name in ("images", "errors"):
            for part in sorted((self.path / name).glob("part-*.parquet")):
                seen.update(pq.read_table(part, columns=["path"])["path"].to_pylist())
        return seen

    def write(self, records: pa.Table) -> Tables:
        """Append one batch's records as a part of each table (heads first: images/errors mark it done)."""
        tables = split(records)
        stem = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        for name in ("heads", "errors", "images"):
            table = getattr(tables, name)
            if table.num_rows:
                _atomic(self.path / name / f"{stem}.parquet", lambda tmp, t=table: pq.write_table(t, tmp))
        return tables


def _atomic(target: Path, write: Callable[[Path], None]) -> None:
    """Write through a temporary name and rename: a reader never sees half a file."""
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
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
    model = model if model is not None else config.load()
    folder = RunFolder(Path(out))
    folder.start(config, model.name)
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


def find_runs(root: str | Path) -> list[Path]:
    """The run folders (those with a ``run.json``) at ``root`` and one level below it, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [root] if (root / "run.json").is_file() else []
    return found + sorted(p for p in root.iterdir() if p.is_dir() and (p / "run.json").is_file())


def signature(out: str | Path) -> tuple:
    """Changes whenever a part file is added: a key for caching a run's tables while it grows."""
    out = Path(out)
    parts = [p for name in TABLES for p in (out / name).glob("part-*.parquet")]
    return len(parts), max((p.stat().st_mtime_ns for p in parts), default=0)


def head_summary(heads):
    """(pandas) one row per (layer, head): the mean of each statistic over the images, and their count."""
    stats = ["entropy", "distance_px", "prefix_share", "mass60_fraction"]
    summary = heads.groupby(["layer", "head"], as_index=False)[stats].mean()
    return summary.assign(images=heads.groupby(["layer", "head"]).size().to_numpy())


def extremes(heads, layer: int, head: int, ranking: str, count: int = 6):
    """(pandas) the ``count`` images where head (``layer``, ``head``) ranks first by ``RANKINGS[ranking]``."""
    column, smallest_first = RANKINGS[ranking]
    rows = heads[(heads["layer"] == layer) & (heads["head"] == head)]
    return rows.sort_values([column, "path"], ascending=[smallest_first, True]).head(count)


def reopen(model: Model, path: str, digest: str, fit: Fit, captures: Path | None = None) -> tuple[Image.Image, Capture]:
    """An image of a run again: the S × S picture the model saw, and its capture — the stored one when
    the run kept captures (``--store qk``), else a fresh capture of the file.

    Raises OSError when the file is gone, :class:`RunError` when its bytes changed since the run.
    """
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise RunError(f"{Path(path).name} has changed since the run.")
    checked = read_photo(data, model, path)
    stored = captures / f"{digest}.npz" if captures is not None else None
    if stored is not None and stored.is_file():
        from .export import load_capture

        return model.view(checked.image, fit), load_capture(stored)
    return model.view(checked.image, fit), capture(model, checked.image, fit)
