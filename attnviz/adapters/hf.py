"""Hugging Face ``transformers`` vision models: ViT, DeiT (with or without its distillation
token), Dinov2, Dinov2WithRegisters and CLIP's vision tower.

Their attention modules (``ViTAttention``, ``CLIPAttention``, ...) compute
query = q_proj(h), key = k_proj(h), split into heads, and hand them to the attention function with
``scaling`` = d_k^-1/2 and no mask, on the eager and the SDPA path alike. So the outputs of
``q_proj`` and ``k_proj``, reshaped (N, H · d_k) → (H, N, d_k), are exactly the logits' q and k, and
the model runs its fast SDPA path while we read them.

Loading (:func:`load`) is offline and never unpickles: a local folder or the local Hugging Face
cache, ``model.safetensors`` (or its shards) only; preprocessing comes from the folder's
``preprocessor_config.json`` and class names from ``config.id2label``. Before anything is allocated
(:func:`plan`) the network is built from ``config.json`` on the meta device, so its parameters are
counted for a server's budget, and a folder whose files do not give every tensor it needs is refused.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

import attnviz.weightfiles as weightfiles
from ..errors import IncompleteWeights, ModelError
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap

PREFIX = "hf:"  # load_model("hf:<folder or repo id>")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NO_PREPROCESSOR = "no preprocessor_config.json: ImageNet mean/std assumed"

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
# The first transformers whose attention modules all compute q and k in q_proj and k_proj (Dinov2's had
# attention.query and attention.key up to 5.17): pyproject.toml's extra attnviz[hf] asks for it.
MIN_TRANSFORMERS = "5.18"


def transformers_version() -> str:
    from importlib.metadata import version

    return version("transformers")


def is_hf(network: torch.nn.Module) -> bool:
    return type(network).__module__.startswith("transformers.")


def is_supported(network: torch.nn.Module) -> bool:
    """A Hugging Face class this family reads; any other goes to the generic path (:mod:`.generic`)."""
    return is_hf(network) and type(network).__name__ in ARCHITECTURES


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
        return hf_forward(network, x)


def hf_forward(network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, 3, S, S) → (B, C): a Hugging Face vision model's logits, image embeddings or pooled output (else its first
    token), its position embeddings interpolated where S is not the size it was configured for."""
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
    if not all(hasattr(a, "q_proj") and hasattr(a, "k_proj") for a in attentions):
        raise ModelError(f"attnviz reads {arch}'s queries and keys from its q_proj and k_proj, which transformers has "
                         f"from version {MIN_TRANSFORMERS} on, and this is transformers {transformers_version()}; "
                         f"upgrade it with pip install 'transformers>={MIN_TRANSFORMERS}'.")
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
# Everything is read and checked before a single weight is allocated: config.json (bounded numbers),
# the safetensors headers (checked against their bytes), the network built from the config on the meta
# device, and whether the files give every tensor it needs. Only then does transformers load it.

MAX_LAYERS = 512  # each layer is a few Python modules even on the meta device
MAX_WIDTH = 65_536  # hidden_size, intermediate_size
MAX_HEADS = 1024
MAX_PIXELS = 8192  # image_size, preprocessing sizes
MAX_LABELS = 100_000  # a classifier's classes (config.json builds one name per class)
BOUNDS = {"hidden_size": MAX_WIDTH, "intermediate_size": MAX_WIDTH, "num_hidden_layers": MAX_LAYERS,
          "num_attention_heads": MAX_HEADS, "image_size": MAX_PIXELS, "patch_size": MAX_PIXELS,
          "num_channels": 4, "num_register_tokens": 1024}


def resolve(spec: str) -> tuple[Path, str, str]:
    """A local folder, or a repo id's snapshot in the local Hugging Face cache; never the network.

    Returns the folder, where it came from in words, and the name a visitor may see (no server path).
    """
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return folder, f"Hugging Face folder {folder.name}", f"{PREFIX}{folder.name}"
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
    return Path(found).parent, f"Hugging Face cache {spec}", f"{PREFIX}{spec}"


def reason(error: Exception) -> str:
    """An exception from transformers as the end of one sentence: its type and first line."""
    first = (str(error).strip().splitlines() or [""])[0][:160].rstrip(" .")
    return f"{type(error).__name__}: {first}." if first else f"{type(error).__name__}."


def read_json(path: Path) -> dict:
    return weightfiles.read_json(path)


def architecture(folder: Path, settings: dict) -> str:
    archs = settings.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ModelError(f"config.json in {folder.name} gives architectures as {archs!r:.60}, not a list of names.")
    if "CLIPModel" in archs:
        return "CLIPVisionModel"  # the vision tower of a full CLIP checkpoint
    for arch in archs:
        if arch in ARCHITECTURES:
            return arch
    raise ModelError(f"{folder.name} holds a {', '.join(archs)[:200] or 'model of unknown type'}; attnviz reads {SUPPORTED}.")


def vision_settings(arch: str, settings: dict) -> dict:
    """The part of config.json that describes the vision network (a full CLIP's vision_config)."""
    if arch.startswith("CLIP") and settings.get("model_type") == "clip":
        vision = settings.get("vision_config")
        if not isinstance(vision, dict):
            raise ModelError("config.json of a CLIP model has no vision_config object.")
        return vision
    return settings


def check_settings(name: str, vision: dict) -> None:
    """Every size config.json gives is a whole number in range: a hostile config cannot make the meta
    build itself take minutes (a million layers) or crash (a size of "x")."""
    for key, limit in BOUNDS.items():
        value = vision.get(key)
        if value is None:
            continue
        sides = value if key in ("image_size", "patch_size") and isinstance(value, list) and len(value) == 2 else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= limit for v in sides):
            raise ModelError(f"config.json in {name} gives {key} as {value!r:.40}, not a whole number from 1 to {limit:,}.")
    labels = vision.get("id2label")
    classes = vision.get("num_labels", len(labels) if isinstance(labels, dict) else None)
    if labels is not None and not isinstance(labels, dict):
        raise ModelError(f"config.json in {name} gives id2label as {labels!r:.40}, not an object of class names.")
    if classes is not None and not (isinstance(classes, int) and not isinstance(classes, bool) and 0 <= classes <= MAX_LABELS):
        raise ModelError(f"config.json in {name} gives {classes!r:.40} classes, not a whole number up to {MAX_LABELS:,}.")
    if isinstance(labels, dict) and len(labels) > MAX_LABELS:
        raise ModelError(f"config.json in {name} names {len(labels):,} classes, more than {MAX_LABELS:,}.")


def weight_files(folder: Path) -> tuple[Path, ...]:
    """The safetensors files transformers loads from ``folder``: model.safetensors, or the shards its
    index names (each a plain file name inside the folder). Pickled formats are refused unread."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if os.path.lexists(single):
        weightfiles.regular_file(single)
        return (single,)
    if os.path.lexists(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelError(f"{index.name} in {folder.name} has no weight_map naming its shards.")
        shards = set(weight_map.values())
        for shard in shards:
            if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
                raise ModelError(f"{index.name} in {folder.name} names the shard {shard!r:.60}, "
                                 "not a .safetensors file inside the folder.")
            weightfiles.regular_file(folder / shard)
        return tuple(sorted(folder / shard for shard in shards))
    pickled = [name for name in PICKLES if (folder / name).exists()]
    if pickled:
        raise ModelError(
            f"{folder.name} holds only {pickled[0]}, a pickled format that can run code when loaded; "
            "attnviz reads model.safetensors only."
        )
    raise ModelError(f"{folder.name} has no model.safetensors.")


def files(spec: str) -> tuple[Path, ...]:
    """Every file whose bytes make up model ``hf:<spec>`` (what a cache key of its content is made of)."""
    folder = Path(spec).expanduser()
    settings = [folder / name for name in ("config.json", "preprocessor_config.json", "model.safetensors.index.json")]
    return (*[p for p in settings if p.is_file()], *weight_files(folder))


@dataclass(frozen=True, eq=False)
class Plan:
    """What ``hf:<spec>`` is, read and checked before any weight is allocated."""

    folder: Path
    origin: str  # where it came from, in words
    public_name: str  # the name a visitor may see: never a server path
    arch: str
    config: object  # the transformers config the network is built from
    network: torch.nn.Module = field(repr=False)  # built on the meta device: shapes, no memory
    files: tuple[Path, ...]
    held: dict = field(repr=False)  # name → shape of every tensor in the files

    @property
    def parameters(self) -> int:
        """The larger of what the config describes and what the files hold."""
        return max(sum(p.numel() for p in self.network.parameters()), weightfiles.count(self.held))

    def coverage(self) -> weightfiles.Coverage:
        network = self.network
        prefix = network.base_model_prefix
        ignored = [re.compile(p) for p in (getattr(network, "_keys_to_ignore_on_load_missing", None) or ())]
        tied = set(getattr(network, "all_tied_weights_keys", None) or ())
        needed = {k: v for k, v in weightfiles.expected(network).items()
                  if k not in tied and not any(p.search(k) for p in ignored)}

        def aliases(name: str) -> list[str]:
            # transformers adds or strips the base model's prefix (a ViTModel from a classifier's file)
            names = [name, f"{prefix}.{name}"]
            return names + ([name[len(prefix) + 1:]] if prefix and name.startswith(prefix + ".") else [])

        return weightfiles.uncovered(needed, loaded_names(network, self.held), aliases)


def loaded_names(network: torch.nn.Module, held: dict) -> dict:
    """The files' tensors under the names transformers loads them as: checkpoints keep their original
    names (``encoder.layer.0.attention.attention.query``) and transformers renames them into the
    network's (``layers.0.attention.q_proj``) with its conversion mapping, which this applies to the
    names alone. A tensor a converter splits or merges has no shape here (None): it is reshaped."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:  # another transformers: the names as they are (the load itself checks again)
        return dict(held)
    mapping = get_model_conversion_mapping(network)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    meta, prefix, names = network.state_dict(), network.base_model_prefix, {}
    for key, shape in held.items():
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, meta)
        if renamed not in meta and key in meta:  # as transformers does: the key was already the network's
            renamed, pattern = rename_source_key(key, [], [], prefix, meta)
        if pattern is None:
            names[renamed] = shape
            continue
        targets = next(c for c in converters if pattern in c.source_patterns).target_patterns
        for target in targets:  # one tensor becomes several (a fused qkv into q, k and v)
            names[renamed.replace(targets[0], target)] = None
    return names


def needs_transformers():
    """The ``transformers`` module, or one sentence naming the extra that installs it."""
    try:
        import transformers
    except ImportError:
        raise ModelError("Hugging Face models (\"hf:…\") need the transformers package, which is not installed: "
                         "pip install 'attnviz[hf]'.") from None
    return transformers


def plan(spec: str) -> Plan:
    transformers = needs_transformers()  # before anything else: the sentence, not a traceback, without the extra
    folder, origin, public_name = resolve(spec)
    config_path = folder / "config.json"
    if not os.path.lexists(config_path):
        raise ModelError(f"{folder.name} has no config.json, so it is not a Hugging Face model folder.")
    settings = read_json(config_path)
    arch = architecture(folder, settings)
    vision = vision_settings(arch, settings)
    check_settings(folder.name, vision)
    weights = weight_files(folder)
    held = weightfiles.tensors_of(weights)
    cls = getattr(transformers, arch)
    try:
        config = cls.config_class.from_dict(vision)
        with torch.device("meta"), weightfiles.skip_meta_init():
            network = cls(config)
    except Exception as e:  # a config transformers cannot build: one sentence
        raise ModelError(f"config.json in {folder.name} does not describe a {arch} that can be built: {reason(e)}") from e
    return Plan(folder, origin, public_name, arch, config, network, weights, held)


def parameters(spec: str, size: int | None) -> int:
    """Parameters of ``hf:<spec>``, counted on the meta device and from the safetensors headers."""
    return plan(spec).parameters


def data_config(folder: Path, image_size: int) -> tuple[dict, str]:
    """The folder's preprocessor_config.json as timm's data_config, and a note on where it came from.

    Hugging Face resizes either the shorter side to ``shortest_edge`` (then centre-crops) or the
    whole photo to height × width (then optionally centre-crops); timm says the same with
    ``crop_pct`` = crop / resize and ``crop_mode`` = "center" or "squash". Anything else it may say
    is refused in one sentence rather than guessed.
    """
    path = folder / "preprocessor_config.json"
    if not os.path.lexists(path):
        cfg = dict(input_size=(3, image_size, image_size), mean=IMAGENET_MEAN, std=IMAGENET_STD,
                   interpolation="bicubic", crop_pct=1.0, crop_mode="center")
        return cfg, NO_PREPROCESSOR
    p = read_json(path)
    factor = p.get("rescale_factor", 1 / 255)
    if p.get("do_rescale", True) and (not _number(factor) or abs(factor - 1 / 255) > 1e-9):
        raise ModelError(f"{path.name} rescales pixels by {factor!r:.40}, not 1/255, which attnviz does not reproduce.")
    size, shortest = _square(path.name, "size", p.get("size"), shortest_edge=True)
    crop, _ = _square(path.name, "crop_size", p.get("crop_size"), shortest_edge=False)
    resize = size or image_size
    do_crop = bool(p.get("do_center_crop", False)) and crop is not None
    side = crop if do_crop else resize
    normalise = p.get("do_normalize", True)
    resample = p.get("resample", 2)
    if isinstance(resample, bool) or not isinstance(resample, int) or resample not in RESAMPLE:
        raise ModelError(f"{path.name} gives resample as {resample!r:.40}, not a PIL filter number from 0 to 5.")
    cfg = dict(
        input_size=(3, side, side),
        mean=_channels(path.name, "image_mean", p.get("image_mean", 0.5), positive=False) if normalise else (0.0,) * 3,
        std=_channels(path.name, "image_std", p.get("image_std", 0.5), positive=True) if normalise else (1.0,) * 3,
        interpolation=RESAMPLE[resample],
        crop_pct=side / resize,
        crop_mode="center" if shortest else "squash",
    )
    return cfg, f"preprocessing from {path.name}"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pixels(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PIXELS


def _square(file: str, key: str, value, shortest_edge: bool) -> tuple[int | None, bool]:
    """A preprocessing size as (side, whether it is the shorter side), or one sentence.

    Accepted: a number, {"height": n, "width": n} and, for ``size``, {"shortest_edge": n}.
    """
    if value is None or value == {}:
        return None, False
    if _pixels(value):
        return value, shortest_edge
    if isinstance(value, dict):
        if shortest_edge and set(value) == {"shortest_edge"} and _pixels(value["shortest_edge"]):
            return value["shortest_edge"], True
        if set(value) == {"height", "width"} and _pixels(value["height"]) and _pixels(value["width"]):
            if value["height"] != value["width"]:
                raise ModelError(f"{file} asks for a non-square {key}, and attnviz needs a square input.")
            return value["height"], False
    forms = '{"shortest_edge": n} or {"height": n, "width": n}' if shortest_edge else '{"height": n, "width": n}'
    raise ModelError(f"{file} gives {key} as {value!r:.60}, which attnviz does not read (it reads a number or {forms}).")


def _channels(file: str, key: str, value, positive: bool) -> tuple[float, float, float]:
    values = [value] * 3 if _number(value) else value
    if (not isinstance(values, list) or len(values) != 3 or not all(_number(v) for v in values)
            or (positive and not all(v > 0 for v in values))):
        raise ModelError(f"{file} gives {key} as {value!r:.60}, not three {'positive ' if positive else ''}numbers.")
    return tuple(float(v) for v in values)


def load(spec: str, size: int | None, device: torch.device) -> dict:
    """Everything :class:`attnviz.Model` needs from ``hf:<spec>``, read offline and without pickles.

    A folder whose files do not give every tensor the config describes is refused before anything is
    allocated (:class:`attnviz.errors.IncompleteWeights`), never filled with random values.
    """
    p = plan(spec)
    p.coverage().check(p.folder.name, p.arch)
    transformers = needs_transformers()
    try:
        network, info = getattr(transformers, p.arch).from_pretrained(
            p.folder, config=p.config, use_safetensors=True, local_files_only=True, attn_implementation="sdpa",
            dtype=torch.float32, output_loading_info=True,
        )
    except Exception as e:  # transformers raises many kinds; the page needs one sentence
        raise ModelError(f"Could not load {p.folder.name} as {p.arch}: {reason(e)}") from e
    unfilled = sorted({*info.get("missing_keys", ()), *(k[0] for k in info.get("mismatched_keys", ()))})
    if unfilled:  # the check above reads names as transformers does; should they ever differ, still refuse
        raise IncompleteWeights(
            f"{p.folder.name} does not give {len(unfilled)} of the tensors {p.arch} needs (e.g. {unfilled[0]}); "
            "attnviz does not fill missing weights with random values.", missing=len(unfilled))
    config = network.config
    cfg, note = data_config(p.folder, config.image_size if isinstance(config.image_size, int) else config.image_size[0])
    size = cfg["input_size"][-1] if size is None else size
    cfg["input_size"] = (3, size, size)
    labels = None
    if "Classification" in p.arch:
        labels = tuple(str(config.id2label.get(i, f"class {i}")) for i in range(config.num_labels))
    notes, note_keys = (), ()
    if note == NO_PREPROCESSOR:  # a guess the person looking at the photo should know about
        notes = (f"{p.public_name} has no preprocessor_config.json, so attnviz normalises its photos with ImageNet's "
                 f"mean {IMAGENET_MEAN} and standard deviation {IMAGENET_STD}; if it was trained with other values, "
                 "its attention here is not what it computes on its own inputs.",)
        note_keys = (("no_preprocessor", {"name": p.public_name, "mean": IMAGENET_MEAN, "std": IMAGENET_STD}),)
    return dict(network=network, name=f"{PREFIX}{spec}", public_name=p.public_name,
                provenance=f"{p.origin} ({p.arch}; {note})", size=size, data_config=cfg, labels=labels, notes=notes,
                note_keys=note_keys)


FAMILY = register(Family("Hugging Face", adapter, recognises=is_supported, prefix=PREFIX, load=load,
                         parameters=parameters, files=files))
