"""What a model's weight files hold, read from their headers alone, and whether that covers the model.

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape and byte
range) and the tensors' bytes. :func:`tensors` reads only the header and checks every entry against
the bytes the file really holds, so a header cannot claim a shape its file does not store, and a
name such as ``"shape": ["x"]`` is one sentence, not a traceback. :func:`uncovered` compares what the
files hold with the parameters of the network they are meant for, built on PyTorch's meta device
(:func:`skip_meta_init`: no memory, and no time spent on a random initialisation that means nothing
there), so a checkpoint that would leave tensors randomly initialised is refused before anything is
allocated.
"""
from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import IncompleteWeights, ModelError

MAX_HEADER_BYTES = 16 * 2**20  # ~100 k tensors; a ViT-g's header is 0.1 MB (safetensors itself stops at 100 MB)
MAX_JSON_BYTES = 4 * 2**20  # config.json, preprocessor_config.json, model.safetensors.index.json
MAX_DIMS = 32  # a tensor of more dimensions is not a model weight
# bits per value of every safetensors dtype (safetensors 0.8)
DTYPE_BITS = {
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}
Shapes = Mapping[str, tuple[int, ...]]


def regular_file(path: Path) -> os.stat_result:
    """The file's stat when it is a regular file (after symlinks); one sentence for anything else.

    A FIFO would block the first read forever and ``/dev/zero`` would never end, so neither is opened.
    """
    try:
        info = os.stat(path)
    except OSError as e:
        raise ModelError(f"{path.name} cannot be read: {e.strerror or type(e).__name__}.") from e
    if not stat.S_ISREG(info.st_mode):
        raise ModelError(f"{path.name} is not a regular file (a folder, a pipe or a device), so it is not read.")
    return info


def _open(path: Path) -> tuple[int, os.stat_result]:
    regular_file(path)
    try:  # O_NONBLOCK: should a pipe replace the file between the check and here, open does not wait for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ModelError(f"{path.name} cannot be read: {e.strerror or type(e).__name__}.") from e
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ModelError(f"{path.name} is not a regular file (a folder, a pipe or a device), so it is not read.")
    return fd, info


def read_json(path: Path) -> dict:
    """A small JSON object (a model folder's config), bounded in size, or one sentence naming the file."""
    fd, info = _open(path)
    with os.fdopen(fd, "rb") as f:
        if info.st_size > MAX_JSON_BYTES:
            raise ModelError(f"{path.name} is {info.st_size / 2**20:,.0f} MB, over the {MAX_JSON_BYTES >> 20} MB "
                             "a model's settings file may have.")
        raw = f.read(MAX_JSON_BYTES + 1)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path.name} is not valid JSON.") from e
    if not isinstance(value, dict):
        raise ModelError(f"{path.name} does not hold a JSON object.")
    return value


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes, byte ranges): no tensor is read.

    Only the header's outer form is checked here; :func:`tensors` checks every entry.
    """
    return _header(path)[0]


def _header(path: Path) -> tuple[dict, int]:
    """The header and the number of bytes the file holds after it."""
    fd, info = _open(path)
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"{path.name} is not a safetensors file.")
        (length,) = struct.unpack("<Q", head)
        if length > info.st_size - 8:
            raise ModelError(f"{path.name} is not a safetensors file.")
        if length > MAX_HEADER_BYTES:
            raise ModelError(f"{path.name} has a safetensors header over {MAX_HEADER_BYTES >> 20} MB.")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path.name} is not a safetensors file.") from e
    if not isinstance(header, dict):
        raise ModelError(f"{path.name} is not a safetensors file.")
    return header, info.st_size - 8 - length


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


def tensors(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's name → shape in safetensors file ``path``, each entry checked against the bytes
    the file holds (its byte range inside the file, and the range's length = values × dtype size)."""
    header, data_bytes = _header(path)
    shapes, end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        damaged = f"{path.name} is damaged: its header describes tensor {_short(name)}"
        if not isinstance(entry, dict):
            raise ModelError(f"{damaged} as {_short(entry)}, not as a dtype, shape and byte range.")
        shape, dtype, offsets = entry.get("shape"), entry.get("dtype"), entry.get("data_offsets")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_whole(side) for side in shape):
            raise ModelError(f"{damaged} with the shape {_short(shape)}, not a list of whole sizes.")
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise ModelError(f"{damaged} with the dtype {_short(dtype)}, not a safetensors type such as F32.")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(o) for o in offsets)
                or offsets[0] > offsets[1] or offsets[1] > data_bytes):
            raise ModelError(f"{damaged} at bytes {_short(offsets)}, which the file does not hold.")
        values = 1
        for side in shape:
            values *= side
        if values * DTYPE_BITS[dtype] != 8 * (offsets[1] - offsets[0]):
            raise ModelError(f"{damaged} as {values:,} {dtype} values in {offsets[1] - offsets[0]:,} bytes.")
        shapes[name] = tuple(shape)
        end = max(end, offsets[1])
    if end != data_bytes:  # bytes no tensor uses would still be hashed and read: a file holds its tensors only
        raise ModelError(f"{path.name} is damaged: {data_bytes - end:,} bytes after its header belong to no tensor.")
    return shapes


def tensors_of(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """The tensors of several safetensors files (a sharded checkpoint) together."""
    held: dict[str, tuple[int, ...]] = {}
    for path in files:
        held.update(tensors(Path(path)))
    return held


def count(shapes: Shapes) -> int:
    """The number of values the tensors hold."""
    total = 0
    for shape in shapes.values():
        values = 1
        for side in shape:
            values *= side
        total += values
    return total


def skip_meta_init():
    """A torch-function mode (per thread) that skips in-place ops on meta tensors: the random weight
    initialisation (trunc_normal_, uniform_, …) is most of a meta build's time and means nothing there."""
    import torch
    from torch.overrides import TorchFunctionMode

    class SkipMetaInit(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            in_place = name.endswith("_") and not name.endswith("__")
            if in_place and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
                return args[0]
            return func(*args, **(kwargs or {}))

    return SkipMetaInit()


def expected(network) -> dict[str, tuple[int, ...]]:
    """Name → shape of everything a checkpoint must give ``network`` (parameters and saved buffers)."""
    return {name: tuple(value.shape) for name, value in network.state_dict().items()}


@dataclass(frozen=True)
class Coverage:
    """How much of a network's state its weight files give."""

    needed: int  # tensors the network needs
    missing: tuple[str, ...]  # names the files do not hold
    mismatched: tuple[str, ...]  # names they hold with another shape

    def check(self, what: str, model: str) -> None:
        """Refuse (IncompleteWeights, one sentence) a checkpoint that leaves any tensor unfilled."""
        if self.missing:
            raise IncompleteWeights(
                f"{what} holds {self.needed - len(self.missing)} of the {self.needed} tensors {model} needs "
                f"({len(self.missing)} missing, e.g. {self.missing[0]}); attnviz does not fill missing "
                "weights with random values.", missing=len(self.missing), needed=self.needed)
        if self.mismatched:
            raise IncompleteWeights(
                f"{what} holds {len(self.mismatched)} of the {self.needed} tensors {model} needs with another "
                f"shape (e.g. {self.mismatched[0]}), so it was saved from a different architecture.",
                missing=len(self.mismatched), needed=self.needed)


def uncovered(needed: Shapes, held: Shapes, aliases=lambda name: (name,), reshaped: frozenset[str] = frozenset()
              ) -> Coverage:
    """Which of ``needed`` the files' ``held`` tensors do not give.

    ``aliases(name)``: the names a loader also accepts for ``name`` (e.g. with or without the base
    model's prefix); ``reshaped``: names the loader resamples, so their shape may differ (a position
    table at another input size). A held shape of None is not compared (a loader reshapes it).
    """
    missing, mismatched = [], []
    for name, shape in needed.items():
        alias = next((alias for alias in aliases(name) if alias in held), None)
        if alias is None:
            missing.append(name)
        elif held[alias] is not None and held[alias] != shape and name not in reshaped:
            mismatched.append(name)
    return Coverage(len(needed), tuple(missing), tuple(mismatched))
