"""What the person who starts a shared server lets its visitors do.

A classroom server is one process on the teacher's laptop that everyone on the room's network can open.
A visitor picks models from lists; only the owner, at start, decides what the lists hold:

- ``ATTNVIZ_CHECKPOINTS=/folder``: the checkpoints in that folder are offered (never a typed path):
  ``<timm architecture>--<anything>.safetensors`` (e.g. ``vit_small_patch16_224--run3.safetensors``);
  a ``.safetensors`` file whose metadata names it (``{"arch": "vit_small_patch16_224"}``); a timm hub
  folder (``config.json`` with ``"architecture"`` beside ``model.safetensors``); and a Hugging Face
  transformers folder (``config.json`` with ``"model_type"`` plus ``*.safetensors``), loaded as
  ``load_model("hf:<folder>")``.
- ``ATTNVIZ_ALLOW_DOWNLOADS=1``: hub models that are not in this computer's cache may be downloaded.
  Otherwise the page offers only hub models already cached, and never downloads.
- ``ATTNVIZ_MAX_PARAMS`` (default 100M): the parameter budget. Every architecture the page may load is
  counted first on PyTorch's meta device (no memory allocated) and every checkpoint from its
  safetensors header; over budget is refused before anything is built.
- ``ATTNVIZ_HEAVY_JOBS`` (default: the number of cores): heavy jobs that may run at once.

The library and the CLI are not limited by any of this: they run as their user.
"""
from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .errors import ModelError
from .jobs import core_count

ENV_CHECKPOINTS = "ATTNVIZ_CHECKPOINTS"
ENV_DOWNLOADS = "ATTNVIZ_ALLOW_DOWNLOADS"
ENV_MAX_PARAMS = "ATTNVIZ_MAX_PARAMS"
ENV_HEAVY_JOBS = "ATTNVIZ_HEAVY_JOBS"
DEFAULT_MAX_PARAMS = 100_000_000  # ViT-B/16 (86 M) fits; ViT-L (304 M), ViT-H (632 M), ViT-g (1 B) do not
MAX_LISTED = 200  # checkpoints offered from the owner's folder
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header larger than this is not read
ARCH_SEPARATOR = "--"


class OverBudget(ModelError):
    """A model with more parameters than the server's owner allows."""

    def __init__(self, what: str, params: int, limit: int):
        self.what, self.params, self.limit = what, params, limit
        super().__init__(
            f"{what} has {params / 1e6:,.0f} million parameters, over this server's limit of "
            f"{limit / 1e6:,.0f} million."
        )


@dataclass(frozen=True)
class Policy:
    """The owner's settings, read from the environment the server was started with."""

    checkpoints: Path | None  # folder whose checkpoints the page offers; None: no checkpoints
    allow_downloads: bool  # may the page download hub models that are not cached?
    max_params: int  # parameter budget for anything the page loads
    heavy_jobs: int  # heavy jobs that may run at once, server-wide


def _count(text: str, what: str) -> int:
    """``"300M"``, ``"1.5G"``, ``"86000000"`` → an integer."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGbB]?)\s*", text)
    if not match:
        raise ValueError(f"{what} must be a number such as 100M or 1.5G; got {text!r}.")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def policy(environ: Mapping[str, str] = os.environ) -> Policy:
    """The owner's policy from ``environ`` (empty values count as unset); a ValueError names a bad one."""
    folder = environ.get(ENV_CHECKPOINTS, "").strip()
    downloads = environ.get(ENV_DOWNLOADS, "").strip().lower()
    if downloads not in ("", "0", "1", "no", "yes", "false", "true", "off", "on"):
        raise ValueError(f"{ENV_DOWNLOADS} must be 1 or 0; got {downloads!r}.")
    max_params = environ.get(ENV_MAX_PARAMS, "").strip()
    heavy_jobs = environ.get(ENV_HEAVY_JOBS, "").strip()
    return Policy(
        checkpoints=Path(folder).expanduser() if folder else None,
        allow_downloads=downloads in ("1", "yes", "true", "on"),
        max_params=_count(max_params, ENV_MAX_PARAMS) if max_params else DEFAULT_MAX_PARAMS,
        heavy_jobs=max(1, _count(heavy_jobs, ENV_HEAVY_JOBS)) if heavy_jobs else core_count(),
    )


# --- The owner's folder -----------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    """One entry of the owner's folder, as the page offers it."""

    label: str  # what a visitor sees and picks: the file or folder name, never the full path
    arch: str  # the timm architecture, or a family's name for a folder it loads ("hf:<folder>")
    path: Path  # the .safetensors file, or the folder

    @property
    def is_folder(self) -> bool:
        """A model folder that ``load_model(arch)`` loads by name, not a checkpoint file for ``checkpoint=``."""
        from .adapters import family_of_name

        return family_of_name(self.arch) is not None

    def files(self) -> tuple[Path, ...]:
        """Every file whose bytes make up this checkpoint (what its content key is made of)."""
        if self.is_folder:
            return tuple(sorted([*self.path.glob("*.safetensors"), *self.path.glob("*.json")]))
        return (self.path,)


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes): no tensor is read."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"{path.name} is not a safetensors file.")
        (length,) = struct.unpack("<Q", head)
        if length > os.fstat(f.fileno()).st_size - 8:
            raise ModelError(f"{path.name} is not a safetensors file.")
        if length > MAX_HEADER_BYTES:
            raise ModelError(f"{path.name} has a safetensors header over {MAX_HEADER_BYTES >> 20} MB.")
        try:
            header = json.loads(f.read(length))
        except ValueError as e:
            raise ModelError(f"{path.name} is not a safetensors file.") from e
    if not isinstance(header, dict):
        raise ModelError(f"{path.name} is not a safetensors file.")
    return header


def checkpoint_parameters(files: tuple[Path, ...]) -> int:
    """Number of values stored in these safetensors files, from their headers alone."""
    total = 0
    for path in files:
        if path.suffix != ".safetensors":
            continue
        for name, entry in safetensors_header(path).items():
            if name != "__metadata__" and isinstance(entry, dict):
                count = 1
                for side in entry.get("shape", ()):
                    count *= int(side)
                total += count
    return total


def _is_timm_arch(name: str) -> bool:
    import timm

    return bool(name) and timm.is_model(name.split(".")[0])


def _entry(path: Path) -> Checkpoint | None:
    if path.is_file() and path.suffix == ".safetensors":
        arch, separator, _ = path.stem.partition(ARCH_SEPARATOR)
        if not separator:
            try:
                arch = (safetensors_header(path).get("__metadata__") or {}).get("arch", "")
            except (OSError, ModelError):
                return None
        return Checkpoint(path.name, arch, path) if _is_timm_arch(arch) else None
    config = path / "config.json"
    if path.is_dir() and config.is_file():
        try:
            settings = json.loads(config.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(settings, dict):
            return None
        weights = path / "model.safetensors"
        if _is_timm_arch(settings.get("architecture", "")) and weights.is_file():
            return Checkpoint(path.name, settings["architecture"], weights)
        if settings.get("model_type") and any(path.glob("*.safetensors")):  # a transformers folder
            from .adapters.hf import FAMILY as HUGGING_FACE

            return Checkpoint(path.name, HUGGING_FACE.model_name(str(path)), path)
    return None


def list_checkpoints(folder: Path | None) -> tuple[Checkpoint, ...]:
    """The loadable entries directly inside the owner's folder, sorted by name (at most MAX_LISTED)."""
    if folder is None or not folder.is_dir():
        return ()
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        entry = _entry(path)
        if entry is not None:
            found.append(entry)
            if len(found) == MAX_LISTED:
                break
    return tuple(found)


# --- The budget -------------------------------------------------------------------------------

def _skip_meta_init():
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


def architecture_parameters(arch: str, size: int | None = None) -> int:
    """Parameters of timm architecture ``arch`` at input ``size``, built on the meta device: no memory
    is allocated (a 7-billion-parameter architecture is counted in ~0.2 s)."""
    import timm
    import torch

    kwargs = {} if size is None else {"img_size": size}
    try:
        with torch.device("meta"), _skip_meta_init():
            network = timm.create_model(arch, pretrained=False, **kwargs)
    except Exception as e:  # timm raises many kinds; one sentence for the page
        raise ModelError(f"{arch} could not be built at {size or 'its own'} px: {str(e).splitlines()[0][:160]}") from e
    return sum(p.numel() for p in network.parameters())


def check_budget(what: str, params: int, limit: int) -> None:
    if params > limit:
        raise OverBudget(what, params, limit)


def hub_file(name: str) -> str | None:
    """The weights file of hub model ``name`` in this computer's Hugging Face cache (its path names the
    snapshot, so it changes with the content), or None when it is not cached."""
    from .models import cached_hub_file

    try:
        return cached_hub_file(name)
    except Exception:  # an odd cache layout or name: treat as not cached
        return None


def hub_cached(name: str) -> bool:
    """Is hub model ``name`` already cached here (so loading it downloads nothing)?"""
    return hub_file(name) is not None
