"""What the person who starts a shared server lets its visitors do.

A classroom server is one process on the teacher's laptop that everyone on the room's network can open.
A visitor picks models from lists; only the owner, at start, decides what the lists hold:

- ``ATTNVIZ_CHECKPOINTS=/folder``: the checkpoints in that folder are offered (never a typed path):
  ``<timm architecture>--<anything>.safetensors`` (e.g. ``vit_small_patch16_224--run3.safetensors``);
  a ``.safetensors`` file whose metadata names it (``{"arch": "vit_small_patch16_224"}``); a timm hub
  folder (``config.json`` with ``"architecture"`` beside ``model.safetensors``); and a Hugging Face
  transformers folder (``config.json`` with ``"model_type"`` plus ``*.safetensors``), loaded as
  ``load_model("hf:<folder>")``; and a Python builder, ``<label>.builder`` holding one line
  ``module:callable`` (a function of the owner's that builds the network, importable by the server),
  loaded as ``load_model("py:module:callable")`` and read through its attention calls where no family knows it.
- ``ATTNVIZ_ALLOW_DOWNLOADS=1``: hub models that are not in this computer's cache may be downloaded.
  Otherwise the page offers only hub models already cached, and never downloads.
- ``ATTNVIZ_MAX_PARAMS`` (default 100M): the parameter budget. Whatever the page may load (a timm
  name, a checkpoint, a Hugging Face folder) is counted first by :func:`model_parameters`: the
  architecture its name or config.json describes, on PyTorch's meta device (no memory allocated), and
  its weight files from their safetensors headers; over budget is refused before anything is built.
- ``ATTNVIZ_HEAVY_JOBS`` (default: the number of cores): heavy jobs that may run at once.
- ``ATTNVIZ_LIVE_STREAMS`` (default: the number of cores): live-camera streams that may run at once
  (0: no live camera).
- ``ATTNVIZ_RUNTIME`` (default ``auto``): where the page's captures run — ``auto`` is the fastest CPU runtime
  installed (``pip install 'attnviz[fast]'``: ONNX Runtime, then OpenVINO) where it is checked exact for the
  model at load, else PyTorch; ``pytorch``, ``openvino`` or ``onnxruntime`` choose (:func:`attnviz.runtimes.on_runtime`).

The library and the CLI are not limited by any of this: they run as their user.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import attnviz.weightfiles as weightfiles
from .errors import ModelError
from .jobs import core_count
from .runtimes import RUNTIMES
from .weightfiles import safetensors_header

ENV_CHECKPOINTS = "ATTNVIZ_CHECKPOINTS"
ENV_DOWNLOADS = "ATTNVIZ_ALLOW_DOWNLOADS"
ENV_MAX_PARAMS = "ATTNVIZ_MAX_PARAMS"
ENV_HEAVY_JOBS = "ATTNVIZ_HEAVY_JOBS"
ENV_LIVE_STREAMS = "ATTNVIZ_LIVE_STREAMS"
ENV_RUNTIME = "ATTNVIZ_RUNTIME"
DEFAULT_MAX_PARAMS = 100_000_000  # ViT-B/16 (86 M) fits; ViT-L (304 M), ViT-H (632 M), ViT-g (1 B) do not
MAX_LISTED = 200  # checkpoints offered from the owner's folder
ARCH_SEPARATOR = "--"
RUNTIME_CHOICES = ("auto", "pytorch", *sorted(RUNTIMES))


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
    live_streams: int = field(default_factory=core_count)  # live-camera streams at once, server-wide
    runtime: str = "auto"  # where captures run: auto, pytorch, or a runtime's name (attnviz.runtimes)


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
    live_streams = environ.get(ENV_LIVE_STREAMS, "").strip()
    runtime = environ.get(ENV_RUNTIME, "").strip().lower() or "auto"
    if runtime not in RUNTIME_CHOICES:
        raise ValueError(f"{ENV_RUNTIME} must be one of {', '.join(RUNTIME_CHOICES)}; got {runtime!r}.")
    return Policy(
        checkpoints=Path(folder).expanduser() if folder else None,
        allow_downloads=downloads in ("1", "yes", "true", "on"),
        max_params=_count(max_params, ENV_MAX_PARAMS) if max_params else DEFAULT_MAX_PARAMS,
        heavy_jobs=max(1, _count(heavy_jobs, ENV_HEAVY_JOBS)) if heavy_jobs else core_count(),
        live_streams=_count(live_streams, ENV_LIVE_STREAMS) if live_streams else core_count(),
        runtime=runtime,
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
        """Every file whose bytes make up this checkpoint (what its content key is made of): regular
        files only, as the family that loads a folder names them; a ModelError when one is missing."""
        if self.is_folder:
            from .adapters import family_of_name

            family = family_of_name(self.arch)
            if family.files is None:
                raise ModelError(f"{self.label}: the {family.name} family does not say which files make up its models.")
            return family.files(family.spec(self.arch))
        return (self.path,)


def checkpoint_parameters(files: tuple[Path, ...]) -> int:
    """Number of values stored in these safetensors files, from their headers alone (each header
    checked against the bytes its file holds, so it cannot claim more or less than it stores)."""
    return weightfiles.count(weightfiles.tensors_of(p for p in files if p.suffix == ".safetensors"))


def _is_timm_arch(name: object) -> bool:
    import timm

    return isinstance(name, str) and bool(name) and timm.is_model(name.split(".")[0])


MAX_BUILDER_BYTES = 1024  # a .builder file holds one line


def _builder(path: Path) -> Checkpoint | None:
    """``<label>.builder``: one line ``module:callable``, the owner's function that builds the network."""
    from .adapters.builder import FAMILY as BUILDER, is_spec

    try:
        if weightfiles.regular_file(path).st_size > MAX_BUILDER_BYTES:
            return None
        spec = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeError, ModelError):
        return None
    return Checkpoint(path.stem, BUILDER.model_name(spec), path) if is_spec(spec) else None


def _entry(path: Path) -> Checkpoint | None:
    if path.is_file() and path.suffix == ".builder":
        return _builder(path)
    if path.is_file() and path.suffix == ".safetensors":
        arch, separator, _ = path.stem.partition(ARCH_SEPARATOR)
        if not separator:
            try:
                metadata = safetensors_header(path).get("__metadata__")
            except (OSError, ModelError):
                return None
            arch = metadata.get("arch", "") if isinstance(metadata, dict) else ""
        return Checkpoint(path.name, arch, path) if _is_timm_arch(arch) else None
    config = path / "config.json"
    if path.is_dir() and config.is_file():
        try:
            settings = weightfiles.read_json(config)  # bounded: a 5 GB config.json is not read
        except (OSError, ModelError):
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

def architecture_parameters(arch: str, size: int | None = None, num_classes: int | None = None) -> int:
    """Parameters of timm architecture ``arch`` at input ``size``, built on the meta device: no memory
    is allocated (a 7-billion-parameter architecture is counted in ~0.2 s)."""
    from .models import meta_network

    return sum(p.numel() for p in meta_network(arch, size, num_classes).parameters())


def model_parameters(name: str | None, size: int | None = None, checkpoint: Path | None = None) -> int:
    """Parameters of what ``load_model(name, size, checkpoint=checkpoint)`` would build, counted
    without building it: the architecture on the meta device (a timm name, or the config of a
    family's folder) and the weight files from their headers; the larger of the two.

    The one count behind the budget, for every way a model arrives.
    """
    import attnviz.offline as offline
    from .adapters import family_of_name
    from .models import checkpoint_classes

    if name is None:
        return architecture_parameters(offline.ARCH, size, num_classes=0)
    family = family_of_name(name)
    if family is not None:
        if family.parameters is None:
            raise ModelError(f"{name}: the {family.name} family cannot count its parameters before loading, "
                             "so it cannot be checked against a budget.")
        return family.parameters(family.spec(name), size)
    if checkpoint is None:
        return architecture_parameters(name, size)
    if not Path(checkpoint).exists():  # as load_model says it
        raise ModelError(f"No checkpoint file at {checkpoint}.")
    held = weightfiles.tensors(Path(checkpoint))
    return max(weightfiles.count(held), architecture_parameters(name, size, checkpoint_classes(name, held)))


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
