"""Hugging Face ``transformers`` vision models: ViT, DeiT (with or without its distillation
token), Dinov2, Dinov2WithRegisters and CLIP's vision tower.

Their attention modules (``ViTAttention``, ``CLIPAttention``, ...) compute
query = q_proj(h), key = k_proj(h), split into heads, and hand them to the attention function with
``scaling`` = d_k^-1/2 and no mask, on the eager and the SDPA path alike. So the outputs of
``q_proj`` and ``k_proj``, reshaped (N, H · d_k) → (H, N, d_k), are exactly the logits' q and k, and
the model runs its fast SDPA path while we read them.

Loading (:func:`load`) is offline and never unpickles: a local folder or the local Hugging Face
cache, ``model.safetensors`` only; preprocessing comes from the folder's ``preprocessor_config.json``
and class names from ``config.id2label``.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch

from ..errors import ModelError
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap

PREFIX = "hf:"  # load_model("hf:<folder or repo id>")

# architecture → (attention class, layer class, number of prefix tokens before the patches)
ARCHITECTURES = {
    "ViTModel": "vit", "ViTForImageClassification": "vit",
    "DeiTModel": "deit", "DeiTForImageClassification": "deit", "DeiTForImageClassificationWithTeacher": "deit",
    "Dinov2Model": "dinov2", "Dinov2ForImageClassification": "dinov2",
    "Dinov2WithRegistersModel": "dinov2_reg", "Dinov2WithRegistersForImageClassification": "dinov2_reg",
    "CLIPVisionModel": "clip", "CLIPVisionModelWithProjection": "clip",
}
ATTENTION = {"ViTAttention", "DeiTAttention", "Dinov2Attention", "Dinov2WithRegistersAttention", "CLIPAttention"}
LAYERS = {"ViTLayer", "DeiTLayer", "Dinov2Layer", "Dinov2WithRegistersLayer", "CLIPEncoderLayer"}
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack", "model.ckpt.index")
# PIL resampling codes in preprocessor_config.json → torchvision InterpolationMode values
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
SUPPORTED = "ViT, DeiT, Dinov2, Dinov2WithRegisters and CLIP vision models"


def is_hf(network: torch.nn.Module) -> bool:
    return type(network).__module__.startswith("transformers.")


def num_prefix_tokens(kind: str, config) -> int:
    if kind == "deit":
        return 2  # class token + distillation token
    if kind == "dinov2_reg":
        return 1 + config.num_register_tokens
    return 1


def split_heads(num_heads: int, head_dim: int, output: torch.Tensor) -> torch.Tensor:
    """A projection's (1, N, H · d_k) output → (H, N, d_k) of the one image."""
    return output[0].view(output.shape[1], num_heads, head_dim).transpose(0, 1)


class HFAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        heads = partial(split_heads, self.num_heads, self.head_dim)
        tap.after(attn.q_proj, layer, Recorder.put_query, heads)
        tap.after(attn.k_proj, layer, Recorder.put_key, heads)

    def forward_batch(self, network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        import inspect

        kwargs = {}
        if "interpolate_pos_encoding" in inspect.signature(network.forward).parameters:
            kwargs["interpolate_pos_encoding"] = x.shape[-1] != network.config.image_size
        out = network(pixel_values=x, **kwargs)
        for name in ("logits", "image_embeds", "pooler_output"):
            value = getattr(out, name, None)
            if value is not None:
                return value
        return out.last_hidden_state[:, 0]


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    arch = type(network).__name__
    kind = ARCHITECTURES.get(arch)
    if kind is None:
        raise ModelError(f"{arch} is not one of the Hugging Face models attnviz reads exactly ({SUPPORTED}).")
    config = network.config
    patch = config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]
    # Every supported model interpolates its position embeddings to other sizes when asked.
    check_square_size(arch, patch, size, None, True)
    attentions = tuple(m for m in network.modules() if type(m).__name__ in ATTENTION)
    layers = tuple(m for m in network.modules() if type(m).__name__ in LAYERS)
    if not attentions or len(attentions) != len(layers):
        raise ModelError(f"{arch} does not have the layer structure attnviz knows for {SUPPORTED}.")
    first = attentions[0]
    return HFAdapter(
        family=f"Hugging Face {arch}",
        attentions=attentions,
        blocks=layers,
        num_heads=config.num_attention_heads,
        head_dim=first.head_dim,
        scale=float(getattr(first, "scaling", getattr(first, "scale", first.head_dim**-0.5))),
        patch=patch,
        embed_dim=config.hidden_size,
        num_prefix_tokens=num_prefix_tokens(kind, config),
        has_class_token=True,
    )


# ---- loading a folder -------------------------------------------------------------------------


def resolve(spec: str) -> tuple[Path, str]:
    """A local folder, or a repo id's snapshot in the local Hugging Face cache; never the network."""
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return folder, f"Hugging Face folder {folder}"
    if folder.exists():
        raise ModelError(f"{PREFIX}{spec} is a file; give the folder that holds config.json and model.safetensors.")
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(spec, "config.json")
    except Exception:  # an invalid repo id raises; the sentence below covers it
        found = None
    if not isinstance(found, str):
        raise ModelError(
            f"There is no folder {spec} and no Hugging Face model {spec!r} in the local cache "
            "(attnviz loads Hugging Face checkpoints offline)."
        )
    return Path(found).parent, f"Hugging Face cache {spec}"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"{path.name} in {path.parent} cannot be read: {type(e).__name__}.") from e


def architecture(folder: Path) -> str:
    config = folder / "config.json"
    if not config.is_file():
        raise ModelError(f"{folder} has no config.json, so it is not a Hugging Face model folder.")
    archs = read_json(config).get("architectures") or []
    if "CLIPModel" in archs:
        return "CLIPVisionModel"  # the vision tower of a full CLIP checkpoint
    for arch in archs:
        if arch in ARCHITECTURES:
            return arch
    raise ModelError(f"{folder.name} holds a {', '.join(archs) or 'model of unknown type'}; attnviz reads {SUPPORTED}.")


def check_weights(folder: Path) -> None:
    if (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        return
    pickled = [name for name in PICKLES if (folder / name).exists()]
    if pickled:
        raise ModelError(
            f"{folder.name} holds only {pickled[0]}, a pickled format that can run code when loaded; "
            "attnviz reads model.safetensors only."
        )
    raise ModelError(f"{folder.name} has no model.safetensors.")


def data_config(folder: Path, image_size: int) -> tuple[dict, str]:
    """The folder's preprocessor_config.json as timm's data_config, and a note on where it came from.

    Hugging Face resizes either the shorter side to ``shortest_edge`` (then centre-crops) or the
    whole photo to height × width (then optionally centre-crops); timm says the same with
    ``crop_pct`` = crop / resize and ``crop_mode`` = "center" or "squash".
    """
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        cfg = dict(input_size=(3, image_size, image_size), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                   interpolation="bicubic", crop_pct=1.0, crop_mode="center")
        return cfg, "no preprocessor_config.json: ImageNet mean/std assumed"
    p = read_json(path)
    if p.get("do_rescale", True) and abs(p.get("rescale_factor", 1 / 255) - 1 / 255) > 1e-9:
        raise ModelError(f"{path.name} rescales pixels by {p['rescale_factor']}, not 1/255, which attnviz does not reproduce.")
    size = p.get("size") or {}
    if isinstance(size, int):
        size = {"shortest_edge": size}
    crop = p.get("crop_size") or {}
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    if size.get("height", 0) != size.get("width", 0) or crop.get("height", 0) != crop.get("width", 0):
        raise ModelError(f"{path.name} asks for a non-square input, and attnviz needs a square one.")
    resize = size.get("shortest_edge") or size.get("height") or image_size
    do_crop = bool(p.get("do_center_crop", False)) and bool(crop)
    side = crop["height"] if do_crop else resize
    normalise = p.get("do_normalize", True)
    cfg = dict(
        input_size=(3, side, side),
        mean=tuple(p.get("image_mean", (0.5, 0.5, 0.5))) if normalise else (0.0, 0.0, 0.0),
        std=tuple(p.get("image_std", (0.5, 0.5, 0.5))) if normalise else (1.0, 1.0, 1.0),
        interpolation=RESAMPLE.get(int(p.get("resample", 2)), "bilinear"),
        crop_pct=side / resize,
        crop_mode="center" if "shortest_edge" in size else "squash",
    )
    return cfg, f"preprocessing from {path.name}"


def load(spec: str, size: int | None, device: torch.device) -> dict:
    """Everything :class:`attnviz.Model` needs from ``hf:<spec>``, read offline and without pickles."""
    folder, origin = resolve(spec)
    arch = architecture(folder)
    check_weights(folder)
    import transformers

    try:
        network = getattr(transformers, arch).from_pretrained(
            folder, use_safetensors=True, local_files_only=True, attn_implementation="sdpa", dtype=torch.float32
        )
    except Exception as e:  # transformers raises many kinds; the page needs one sentence
        raise ModelError(f"Could not load {folder.name} as {arch}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    config = network.config
    cfg, note = data_config(folder, config.image_size)
    size = cfg["input_size"][-1] if size is None else size
    cfg["input_size"] = (3, size, size)
    labels = None
    if "Classification" in arch:
        labels = tuple(str(config.id2label.get(i, f"class {i}")) for i in range(config.num_labels))
    return dict(network=network, name=f"{PREFIX}{spec}", provenance=f"{origin} ({arch}; {note})", size=size,
                data_config=cfg, labels=labels)


FAMILY = register(Family("Hugging Face", adapter, recognises=is_hf, prefix=PREFIX, load=load))
