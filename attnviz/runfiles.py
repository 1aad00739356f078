"""Files a server reads from its owner's folders, checked before anything uses them.

A dataset run folder under ``ATTNVIZ_DATASETS`` — and the photos, stored captures and checkpoint it
names — was written by ``attnviz dataset``, or by anyone else with write access, or half of it by a
disk that filled up. So nothing in it is used before it is checked:

- **only regular files, of bounded size**: ``stat`` says what a path is before it is opened (a FIFO
  would block forever, ``/dev/zero`` never ends, a 3 GB file is refused without reading a byte), and
  ``fstat`` on the opened descriptor confirms that what was opened is what was checked;
- ``run.json``: a JSON object holding only the settings a run writes, each of the right kind and range;
- each Parquet part: its footer first (rows, bytes in memory, the columns and their kinds), then its
  values (layers and heads within bounds, every statistic within its range, exactly one row per
  (photo, layer, head), the same photos as its batch's images part);
- the run as a whole: at most :data:`MAX_RUN_ROWS` rows, kept in a compact form (:class:`OpenedRun`).

Each problem is a :class:`RunFileError`: one sentence naming the file and what is wrong with it, with a
catalogue key (``dataset.<key>``) so that the page says it in the reader's language
(:func:`sentence`). A bad part file is left out of the run with its sentence; the rest still opens.
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import attnviz.i18n as i18n
from .errors import RunFileError

TABLES = ("heads", "images", "errors")
FITS = ("crop", "squash")
STORES = ("none", "qk")
MAX_JSON_BYTES = 64 * 2**10  # run.json is ~200 bytes
MAX_LIST_BYTES = 256 * 2**20  # a list file of a million photos is ~100 MB
MAX_CAPTURE_BYTES = 512 * 2**20  # a ViT-L capture at 518 px (--store qk) is ~270 MB
MAX_PART_BYTES = 256 * 2**20  # one part file on disk …
MAX_PART_MEMORY = 512 * 2**20  # … and in memory once read, as its footer says
MAX_PART_ROWS = 1_000_000  # a batch of 64 photos of a 384-head ViT-L is 24 576 rows
MAX_RUN_ROWS = 2_000_000  # head rows of a run the page opens: ~27 000 photos of a 72-head ViT-S, ~56 MB
MAX_ERROR_ROWS = 100_000
MAX_PARTS = 10_000  # part files per table
MAX_SIZE = 1024  # input side in pixels: the page recomputes captures at this size
MAX_DEPTH = 256  # layers, and heads per layer
MAX_TEXT = 4096  # a path or a sentence


# --- Sentences ---------------------------------------------------------------------------------------

def sentence(lang: str, key: str, values: Mapping[str, object]) -> str:
    """The sentence ``dataset.<key>`` in ``lang``, its ``kind`` and ``expected`` words translated too."""
    filled = dict(values)
    if "kind" in filled:
        filled["kind"] = i18n.text(lang, f"dataset.kind_{filled['kind']}")
    if "expected" in filled:
        filled["expected"] = i18n.text(lang, f"dataset.expect_{filled['expected']}", **filled)
    return i18n.text(lang, f"dataset.{key}", **filled)


def problem(key: str, /, **values: object) -> RunFileError:
    """A :class:`RunFileError` whose message is the English sentence of ``dataset.<key>``."""
    return RunFileError(sentence("en", key, values), key, **values)


def _amount(size: int) -> str:
    """Bytes for a person: 820 KB, 3.1 GB."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}" if size < 10 * scale else f"{size / scale:.0f} {unit}"
    return f"{math.ceil(size / 2**10)} KB"


# --- Regular files of bounded size ------------------------------------------------------------------

def _kind(mode: int) -> str | None:
    """What a path is when it is not a regular file (a catalogue word: ``dataset.kind_<word>``)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "socket" if stat.S_ISSOCK(mode) else "other"


def _os_problem(name: str, error: OSError | ValueError) -> RunFileError:
    if isinstance(error, ValueError):  # os.stat refuses a name holding a NUL character
        return problem("not_read", name=name, reason="its name holds a NUL character")
    if error.errno in (errno.ENOENT, errno.ENOTDIR):  # also a link whose target is missing
        return problem("file_missing", name=name)
    if error.errno == errno.ELOOP:
        return problem("file_loop", name=name)
    return problem("not_read", name=name, reason=error.strerror or type(error).__name__)


def _check_stat(info: os.stat_result, limit: int | None, name: str) -> os.stat_result:
    kind = _kind(info.st_mode)
    if kind is not None:
        raise problem("file_not_regular", name=name, kind=kind)
    if limit is not None and info.st_size > limit:
        raise problem("file_too_big", name=name, size=_amount(info.st_size), limit=_amount(limit))
    return info


def check_file(path: str | Path, limit: int | None, name: str | None = None) -> os.stat_result:
    """``stat`` of a regular file (links followed) of at most ``limit`` bytes; :class:`RunFileError` otherwise."""
    name = str(path) if name is None else name
    try:
        info = os.stat(path)
    except (OSError, ValueError) as e:
        raise _os_problem(name, e) from None
    return _check_stat(info, limit, name)


@contextlib.contextmanager
def open_file(path: str | Path, limit: int | None, name: str | None = None) -> Iterator[BinaryIO]:
    """A regular file of at most ``limit`` bytes, opened for reading; never blocks on a FIFO."""
    name = str(path) if name is None else name
    check_file(path, limit, name)  # a FIFO is never opened, a device never read
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _os_problem(name, e) from None
    with os.fdopen(fd, "rb") as f:
        _check_stat(os.fstat(fd), limit, name)  # the file opened is the one checked, not a swap
        yield f


def read_file(path: str | Path, limit: int, name: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (never more are read, even if it grows)."""
    name = str(path) if name is None else name
    try:
        with open_file(path, limit, name) as f:
            data = f.read(limit + 1)
    except OSError as e:  # e.g. EIO, or a file that vanished while being read
        raise _os_problem(name, e) from None
    if len(data) > limit:
        raise problem("file_too_big", name=name, size=_amount(len(data)), limit=_amount(limit))
    return data


# --- run.json ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunInfo:
    """A run's ``run.json``, checked: what it was run with (see :class:`attnviz.dataset.RunConfig`)."""

    model: str | None = None
    size: int | None = None
    checkpoint: str | None = None
    fit: str = "crop"
    store: str = "none"
    model_name: str | None = None

    @property
    def settings(self) -> dict:
        """What decides a run's numbers (``model_name`` only describes it)."""
        return {"model": self.model, "size": self.size, "checkpoint": self.checkpoint, "fit": self.fit,
                "store": self.store}


SETTINGS = tuple(RunInfo.__dataclass_fields__)


def _shown(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "…"


def read_info(path: str | Path, name: str = "run.json") -> RunInfo:
    """``run.json`` checked: a JSON object of the known settings, each of the right kind and range."""
    data = read_file(path, MAX_JSON_BYTES, name)
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise problem("file_not_json", name=name) from None
    if not isinstance(raw, dict):
        raise problem("file_not_settings", name=name)
    unknown = sorted(set(raw) - set(SETTINGS))
    if unknown:
        raise problem("file_unknown_setting", name=name, setting=_shown(unknown[0]))

    def bad(key: str, expected: str) -> RunFileError:
        return problem("file_bad_setting", name=name, setting=key, value=_shown(raw[key]), expected=expected,
                       limit=MAX_SIZE)

    for key in ("model", "checkpoint", "model_name"):
        value = raw.get(key)
        if value is not None and not (isinstance(value, str) and 0 < len(value) <= MAX_TEXT and value.isprintable()):
            raise bad(key, "text")
    size = raw.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIZE):
        raise bad("size", "size")
    if raw.get("fit", "crop") not in FITS:
        raise bad("fit", "fit")
    if raw.get("store", "none") not in STORES:
        raise bad("store", "store")
    return RunInfo(**raw)


# --- Parquet parts ----------------------------------------------------------------------------------

# A run folder's three tables, as attnviz dataset writes them (attnviz.dataset.split).
HEADS = pa.schema([
    ("path", pa.string()), ("digest", pa.string()), ("layer", pa.int32()), ("head", pa.int32()),
    ("entropy", pa.float64()), ("distance_px", pa.float64()), ("prefix_share", pa.float64()),
    ("top_patch", pa.int32()), ("mass60_fraction", pa.float64()),
    ("keys_grid_h", pa.int32()), ("keys_grid_w", pa.int32()),  # the grid top_patch lies on: its layer's keys' grid
])
# Columns a part may lack: runs written before models with stages were summarised (issue #22), whose
# top_patch lies on the image's grid (images: grid_h, grid_w).
OPTIONAL = {"heads": ("keys_grid_h", "keys_grid_w")}
IMAGES = pa.schema([
    ("path", pa.string()), ("digest", pa.string()), ("width", pa.int32()), ("height", pa.int32()),
    ("format", pa.string()), ("input_size", pa.int32()), ("grid_h", pa.int32()), ("grid_w", pa.int32()),
    ("num_prefix_tokens", pa.int32()), ("seconds", pa.float64()),
    ("top5_labels", pa.list_(pa.string())), ("top5_probs", pa.list_(pa.float64())),
])
ERRORS = pa.schema([
    ("path", pa.string()), ("digest", pa.string()), ("error_key", pa.string()), ("error", pa.string()),
    ("error_values", pa.string()),
])
SCHEMAS = {"heads": HEADS, "images": IMAGES, "errors": ERRORS}

EPS = 1e-6  # float rounding at the ends of a statistic's range
RANGES = {  # the values a run can hold, per column; anything else was not written by attnviz dataset
    "layer": (0, MAX_DEPTH - 1), "head": (0, MAX_DEPTH - 1),
    "entropy": (-EPS, 20.0),  # nats: at most log N (< 14 even for 1-pixel patches at MAX_SIZE)
    # NaN where no grid cell is a query at that layer (a model with stages: CaiT's class attention)
    "distance_px": (0.0, MAX_SIZE * math.sqrt(2)), "prefix_share": (-EPS, 1 + EPS),
    "top_patch": (0, MAX_SIZE**2 - 1), "mass60_fraction": (0.0, 1 + EPS),
    "width": (1, 2**31 - 1), "height": (1, 2**31 - 1), "input_size": (1, MAX_SIZE),
    "grid_h": (1, MAX_SIZE), "grid_w": (1, MAX_SIZE), "keys_grid_h": (1, MAX_SIZE), "keys_grid_w": (1, MAX_SIZE), "num_prefix_tokens": (0, MAX_SIZE), "seconds": (0.0, 1e9),
}
NAN_ALLOWED = ("distance_px",)
DIGEST = r"^[0-9a-f]{64}$"
ERROR_KEY = r"^[a-z0-9_]{1,40}$"


def _same_kind(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column holds the kind of values ``wanted`` says (the exact width does not matter)."""
    if pa.types.is_string(wanted):
        return pa.types.is_string(found) or pa.types.is_large_string(found) or (
            pa.types.is_dictionary(found) and _same_kind(found.value_type, wanted))
    if pa.types.is_integer(wanted):
        return pa.types.is_integer(found)
    if pa.types.is_floating(wanted):
        return pa.types.is_floating(found)
    if pa.types.is_list(wanted):
        return (pa.types.is_list(found) or pa.types.is_large_list(found)) and _same_kind(
            found.value_type, wanted.value_type)
    return found == wanted


def read_part(path: Path, table: str, name: str, columns: tuple[str, ...], max_rows: int = MAX_PART_ROWS,
              dictionary: tuple[str, ...] = ()) -> pa.Table:
    """``columns`` of one part of ``table``, after its footer is checked: at most ``max_rows`` rows, its
    size in memory bounded, every column of the table present with the right kind of values (those of
    :data:`OPTIONAL` may be missing, and are then left out of what is read)."""
    schema = SCHEMAS[table]
    with open_file(path, MAX_PART_BYTES, name) as f:
        try:
            part = pq.ParquetFile(f, read_dictionary=list(dictionary) or None)
            meta = part.metadata
            found = part.schema_arrow
        except Exception:  # ArrowInvalid, OSError, …: whatever pyarrow makes of a damaged footer
            raise problem("file_not_parquet", name=name) from None
        if meta.num_rows > max_rows:
            raise problem("file_rows", name=name, rows=meta.num_rows, limit=max_rows)
        in_memory = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if in_memory > MAX_PART_MEMORY:
            raise problem("file_memory", name=name, size=_amount(in_memory), limit=_amount(MAX_PART_MEMORY))
        for wanted in schema:
            index = found.get_field_index(wanted.name)
            if index < 0 and wanted.name in OPTIONAL.get(table, ()):
                columns = tuple(c for c in columns if c != wanted.name)
                continue
            if index < 0:
                raise problem("file_column_missing", name=name, column=wanted.name, table=table)
            if not _same_kind(found.field(index).type, wanted.type):
                raise problem("file_column_type", name=name, column=wanted.name, found=str(found.field(index).type),
                              wanted=str(wanted.type))
        try:
            read = part.read(columns=list(columns), use_threads=False, use_pandas_metadata=False)
        except Exception:
            raise problem("file_not_parquet", name=name) from None
    types = {c: pa.dictionary(pa.int32(), pa.string()) if c in dictionary else schema.field(c).type for c in columns}
    try:
        return read.cast(pa.schema([(c, types[c]) for c in columns]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # e.g. an int64 beyond int32's range
        column = _first_uncastable(read, types)
        low, high = RANGES.get(column, ("…", "…"))
        raise problem("file_out_of_range", name=name, column=column, low=low, high=high) from None


def _first_uncastable(table: pa.Table, types: dict) -> str:
    for column, kind in types.items():
        try:
            table[column].cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return column
    return table.column_names[0]


def _check_values(table: pa.Table, name: str) -> None:
    """Every column within its range (:data:`RANGES`), no empty values, no NaN."""
    for column in table.column_names:
        values = table[column]
        if column in RANGES:
            if values.null_count:
                raise problem("file_empty_values", name=name, column=column)
            if len(values) == 0:
                continue
            if column in NAN_ALLOWED and pa.types.is_floating(values.type):
                values = pc.drop_null(pc.if_else(pc.is_nan(values), None, values))
                if len(values) == 0:
                    continue
            if pa.types.is_floating(values.type) and not pc.all(pc.is_finite(values)).as_py():
                raise problem("file_out_of_range", name=name, column=column, low=RANGES[column][0],
                              high=RANGES[column][1])
            low, high = RANGES[column]
            extent = pc.min_max(values)
            if extent["min"].as_py() < low or extent["max"].as_py() > high:
                raise problem("file_out_of_range", name=name, column=column, low=low, high=high)


def _check_text(table: pa.Table, column: str, name: str, pattern: str | None = None, nullable: bool = False) -> None:
    values = table[column]
    if values.null_count and not nullable:
        raise problem("file_empty_values", name=name, column=column)
    if len(values) == values.null_count:
        return
    lengths = pc.min_max(pc.utf8_length(values))
    bad = lengths["min"].as_py() < 1 or lengths["max"].as_py() > MAX_TEXT
    if not bad and pattern is not None:
        bad = not pc.all(pc.match_substring_regex(values, pattern)).as_py()
    if bad:
        raise problem("file_bad_values", name=name, column=column)


# --- A whole run ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenedRun:
    """A run folder read for showing: checked, compact, with the files that were left out and why.

    ``images`` is sorted by path and row ``i`` is photo ``i``; ``heads`` refers to it by ``image``
    (not by path and digest: 28 bytes a row instead of ~200).
    """

    info: RunInfo
    images: pa.Table  # path, digest, input_size, grid_h, grid_w
    heads: pa.Table  # COMPACT: image (int32), layer, head (int16), the statistics (float32), top_patch (int32)
    errors: pa.Table  # path, error_key, error, error_values (a JSON object)
    num_layers: int
    num_heads: int  # the most heads of any layer
    left_out: tuple[RunFileError, ...] = ()
    heads_per_layer: tuple[int, ...] = ()  # (L,): a model with stages has its own count per layer
    layer_grids: tuple[tuple[int, int], ...] = ()  # (L,) (h, w): the grid each layer's top_patch lies on

    def heads_of(self, layer: int) -> int:
        """Heads of ``layer`` (0-based)."""
        return self.heads_per_layer[layer] if self.heads_per_layer else self.num_heads

    @property
    def staged(self) -> bool:
        """Whether the layers differ in heads or grid (a model with stages)."""
        return len(set(self.heads_per_layer)) > 1 or len(set(self.layer_grids)) > 1


IMAGE_COLUMNS = ("path", "digest", "input_size", "grid_h", "grid_w")
HEAD_COLUMNS = ("path", "layer", "head", "entropy", "distance_px", "prefix_share", "top_patch", "mass60_fraction",
                "keys_grid_h", "keys_grid_w")
ERROR_COLUMNS = ("path", "error_key", "error", "error_values")
COMPACT = pa.schema([
    ("image", pa.int32()), ("layer", pa.int16()), ("head", pa.int16()), ("entropy", pa.float32()),
    ("distance_px", pa.float32()), ("prefix_share", pa.float32()), ("top_patch", pa.int32()),
    ("mass60_fraction", pa.float32()),
])


def parts(folder: Path, table: str) -> dict[str, Path]:
    """``part-*.parquet`` of one table by stem (hidden temporary files are not parts), at most :data:`MAX_PARTS`."""
    found: dict[str, Path] = {}
    try:
        entries = os.scandir(folder / table)
    except OSError:  # no such table yet (or not a folder): no parts
        return found
    with entries:
        for entry in entries:
            if entry.name.startswith("part-") and entry.name.endswith(".parquet"):
                found[entry.name.removesuffix(".parquet")] = Path(entry.path)
                if len(found) > MAX_PARTS:
                    raise problem("run_too_many_parts", name=f"{folder.name}/{table}", limit=MAX_PARTS)
    return dict(sorted(found.items()))


def signature(out: str | Path) -> tuple:
    """Changes whenever a part file is added, replaced or removed: a key for caching a run while it grows.

    Never fails: a part that vanishes or a table that is not a folder is simply what the key says.
    """
    out = Path(out)
    key: list = []
    for table in TABLES:
        try:
            found = parts(out, table)
        except RunFileError:
            key.append(("too many", table))
            continue
        stamps = []
        for path in found.values():
            try:
                info = os.lstat(path)
                stamps.append((info.st_mtime_ns, info.st_size, info.st_ino))
            except OSError:
                stamps.append(None)
        key.append((len(found), hash(tuple(stamps))))
    try:
        meta = os.stat(out / "run.json")
        key.append((meta.st_mtime_ns, meta.st_size, meta.st_ino))
    except (OSError, ValueError):
        key.append(None)
    return tuple(key)


@dataclass(frozen=True)
class Layout:
    """A run's layers as its heads rows say: each layer's head count and the grid its top_patch lies on."""

    heads: tuple[int, ...]  # (L,)
    grids: tuple[tuple[int, int], ...]  # (L,) (h, w): the layer's keys' grid

    @property
    def num_layers(self) -> int:
        return len(self.heads)

    @property
    def num_heads(self) -> int:
        """The most heads of any layer (every layer's, for a model without stages)."""
        return max(self.heads, default=0)


def _batch(out: Path, stem: str, heads_path: Path | None) -> tuple[pa.Table, pa.Table, Layout]:
    """One batch (its images part and the heads part of the same stem), checked; heads refer to images by index."""
    images_name, heads_name = f"images/{stem}.parquet", f"heads/{stem}.parquet"
    images = read_part(out / images_name, "images", images_name, IMAGE_COLUMNS)
    _check_values(images.drop_columns(["path", "digest"]), images_name)
    _check_text(images, "path", images_name)
    _check_text(images, "digest", images_name, DIGEST)
    if pc.count_distinct(images["path"]).as_py() != images.num_rows:
        raise problem("file_bad_values", name=images_name, column="path")
    if heads_path is None:
        raise problem("file_no_heads", name=heads_name, count=images.num_rows)
    heads = read_part(heads_path, "heads", heads_name, HEAD_COLUMNS, dictionary=("path",))
    _check_values(heads.drop_columns(["path"]), heads_name)
    if heads["path"].null_count:
        raise problem("file_empty_values", name=heads_name, column="path")
    if heads.num_rows == 0:
        raise problem("file_grid", name=heads_name)
    heads = heads.unify_dictionaries().combine_chunks()
    path = heads["path"].chunk(0)  # DictionaryArray: indices into the names of the part's photos
    where = pc.fill_null(pc.index_in(path.dictionary, value_set=images["path"].combine_chunks()), -1).to_numpy()
    image = where[path.indices.to_numpy()]  # (rows,): the photo of each row, its index in this batch's images
    if (image < 0).any():
        raise problem("file_other_photos", name=heads_name, images=images_name)
    layer, head = heads["layer"].to_numpy().astype(np.int64), heads["head"].to_numpy().astype(np.int64)
    layers = int(layer.max()) + 1
    per_layer = np.zeros(layers, np.int64)  # (L,): heads of each layer (a model with stages: its own count each)
    np.maximum.at(per_layer, layer, head + 1)
    first = np.concatenate([[0], np.cumsum(per_layer)[:-1]])  # (L,): the layer's first cell among a photo's
    cells = images.num_rows * int(per_layer.sum())
    if (per_layer == 0).any() or heads.num_rows != cells or np.bincount(
            image * int(per_layer.sum()) + first[layer] + head, minlength=cells).max() != 1:
        raise problem("file_grid", name=heads_name)
    if "keys_grid_h" in heads.column_names:  # each row's own grid: its layer's keys' grid
        grid_h, grid_w = heads["keys_grid_h"].to_numpy(), heads["keys_grid_w"].to_numpy()
    else:  # a run from before stages: every layer on the image's grid
        grid_h, grid_w = images["grid_h"].to_numpy()[image], images["grid_w"].to_numpy()[image]
    grids = np.zeros((layers, 2), np.int64)
    grids[layer] = np.stack([grid_h, grid_w], -1)
    if (grids[layer] != np.stack([grid_h, grid_w], -1)).any():  # one grid per layer, the same in every photo
        raise problem("file_bad_values", name=heads_name, column="keys_grid_h")
    if (heads["top_patch"].to_numpy() >= grid_h.astype(np.int64) * grid_w).any():
        raise problem("file_out_of_range", name=heads_name, column="top_patch", low=0, high="h · w − 1")
    compact = pa.table({"image": image.astype(np.int32), **{c: heads[c] for c in COMPACT.names[1:]}}).cast(COMPACT)
    layout = Layout(tuple(int(n) for n in per_layer), tuple((int(h), int(w)) for h, w in grids))
    return images, compact, layout


def _errors(out: Path, stem: str) -> pa.Table:
    name = f"errors/{stem}.parquet"
    errors = read_part(out / name, "errors", name, ERROR_COLUMNS)
    _check_text(errors, "path", name)
    _check_text(errors, "error_key", name, ERROR_KEY)
    _check_text(errors, "error", name)
    _check_text(errors, "error_values", name)
    for text in errors["error_values"].to_pylist():
        try:
            ok = isinstance(json.loads(text), dict)
        except (ValueError, RecursionError):
            ok = False
        if not ok:
            raise problem("file_bad_values", name=name, column="error_values")
    return errors


def open_run(out: str | Path) -> OpenedRun:
    """A run folder checked and read for showing; :class:`RunFileError` when the run cannot be shown at all.

    A batch whose images or heads part is damaged, or whose layers and heads differ from the rest of the
    run, is left out (``left_out`` says why, one sentence per file); heads parts of batches that never
    got their images part (an interrupted run) are not part of the run and are passed over. At most
    :data:`MAX_RUN_ROWS` head rows and :data:`MAX_ERROR_ROWS` error rows are read.
    """
    out = Path(out)
    info = read_info(out / "run.json")
    found = {table: parts(out, table) for table in TABLES}
    left_out: list[RunFileError] = []
    batches: list[tuple[str, pa.Table, pa.Table, Layout]] = []
    rows = 0
    for stem in found["images"]:
        try:
            images, heads, layout = _batch(out, stem, found["heads"].get(stem))
        except RunFileError as e:
            left_out.append(e)
            continue
        rows += heads.num_rows
        if rows > MAX_RUN_ROWS:
            raise problem("run_too_big", name=out.name, limit=MAX_RUN_ROWS)
        batches.append((stem, images, heads, layout))
    # The run's layers × heads are those most of its photos have (on a tie, most of its batches); a batch
    # with others is left out.
    photos, counted = Counter(), Counter()
    for _, images, _, layout in batches:
        photos[layout] += images.num_rows
        counted[layout] += 1
    common = max(photos, key=lambda k: (photos[k], counted[k])) if photos else Layout((), ())
    kept, offset = [], 0
    for stem, images, heads, layout in batches:
        if layout != common:
            left_out.append(problem("file_layout", name=f"heads/{stem}.parquet", layers=layout.num_layers,
                                    heads=layout.num_heads, run_layers=common.num_layers, run_heads=common.num_heads))
            continue
        kept.append((images, heads.set_column(0, "image", pc.add(heads["image"], pa.scalar(offset, pa.int32())))))
        offset += images.num_rows
    images, heads = _merge(kept)
    errors, error_rows = [], 0
    for stem in found["errors"]:
        try:
            table = _errors(out, stem)
        except RunFileError as e:
            left_out.append(e)
            continue
        error_rows += table.num_rows
        if error_rows > MAX_ERROR_ROWS:
            raise problem("run_too_big", name=out.name, limit=MAX_ERROR_ROWS)
        errors.append(table)
    errors = pa.concat_tables(errors) if errors else ERRORS.empty_table().select(list(ERROR_COLUMNS))
    return OpenedRun(info, images, heads, errors.take(_first_of_each(errors["path"])), common.num_layers,
                     common.num_heads, tuple(left_out), common.heads, common.grids)


def _first_of_each(paths: pa.ChunkedArray) -> pa.Array:
    """Row indices of the first row of each path, in path order (a path repeated by a rerun counts once)."""
    _, first = np.unique(np.array(paths.to_pylist(), dtype=object), return_index=True)
    return pa.array(first.astype(np.int64), pa.int64())


def _merge(kept: list[tuple[pa.Table, pa.Table]]) -> tuple[pa.Table, pa.Table]:
    """The batches' images (sorted by path, each path once) and heads (``image`` renumbered to match)."""
    if not kept:
        return IMAGES.empty_table().select(list(IMAGE_COLUMNS)), COMPACT.empty_table()
    images = pa.concat_tables([i for i, _ in kept])
    heads = pa.concat_tables([h for _, h in kept]).combine_chunks()
    first = _first_of_each(images["path"])
    position = np.full(images.num_rows, -1, dtype=np.int64)
    position[first.to_numpy()] = np.arange(len(first))
    image = position[heads["image"].to_numpy()]  # (rows,): the photo's row in the sorted images, or -1
    keep = image >= 0
    heads = heads.filter(pa.array(keep)).set_column(0, "image", pa.array(image[keep].astype(np.int32)))
    return images.take(first), heads
