"""One adapter per model family: what are this layer's exact attention logits?

The capture hooks a network only through its adapter and never asks which family it is. Each
adapter knows which modules to hook to read every layer's queries and keys, how to turn what it read
into the exact q and k that enter softmax(q · kᵀ · scale + bias), the additive logit bias if the
family has one, the token layout (patch size, prefix tokens, whether token 0 is a class token) and,
where it has one, an eager forward that class-specific relevance can differentiate.

Each family is one module of this package that ends with ``register(Family(...))``
(:mod:`.registry`); :func:`adapter_for` asks every registered family in turn. Adding a family is
adding a module (docs/architecture.md, "How to add a model family").

| family | module | attention classes |
|---|---|---|
| timm ViT | :mod:`.timm_vit` | ``timm.layers.Attention`` (ViT, DeiT, DINO, DINOv2, registers) |
| timm RoPE | :mod:`.timm_rope` | ``EvaAttention``, ``AttentionRope`` (EVA-02, DINOv3, PE, ``vit_*_rope*``) |
| timm relative position | :mod:`.timm_relpos` | ``RelPosAttention`` (``vit_relpos_*``, ``vit_srelpos_*``) |
| timm BEiT | :mod:`.timm_beit` | ``beit.Attention`` (BEiT, BEiT v2; per-layer and shared relative position bias) |
| timm Swin | :mod:`.timm_swin` | Swin ``WindowAttention``, Swin V2's (cosine attention, continuous position bias): stages |
| timm TinyViT | :mod:`.timm_tiny_vit` | TinyViT ``Attention`` (windows with a learned bias after an MBConv stage): stages |
| timm EfficientViT (MSRA) | :mod:`.timm_efficientvit_msra` | ``CascadedGroupAttention`` in ``LocalWindowAttention`` (one softmax per head, learned bias): stages |
| timm EfficientFormer | :mod:`.timm_efficientformer` | ``efficientformer.Attention`` in Meta3D blocks: global attention with a learned bias over the last stage's grid |
| timm Visformer | :mod:`.timm_visformer` | ``visformer.Attention``: global attention on the feature maps of two stages (1 × 1 convolution ``qkv``) |
| timm SHViT | :mod:`.timm_shvit` | ``SHSA``: single-head global attention on the first ``pdim`` channels of each stage's feature map |
| timm Swin V2 (cr) | :mod:`.timm_swin_cr` | ``WindowMultiHeadAttention`` (``swinv2_cr_*``: cosine windows, meta-network bias): stages |
| timm NesT | :mod:`.timm_nest` | NesT's ``Attention`` inside image blocks (``nest_*``): levels, each block a window |
| timm PiT | :mod:`.timm_pit` | ``timm.layers.Attention`` in PiT's pooled stages (class and distillation tokens first) |
| timm CaiT | :mod:`.timm_cait` | ``TalkingHeadAttn`` (logits mixed across heads), then ``ClassAttn`` (the class token the one query) |
| timm LeViT | :mod:`.timm_levit` | LeViT ``Attention``, ``AttentionDownsample`` (learned bias, sub-sampled queries; linear and conv): stages |
| timm EfficientFormer V2 | :mod:`.timm_efficientformer_v2` | ``Attention2d`` (talking heads, learned bias, strided grid), ``Attention2dDownsample``: stages |
| timm PVT v2 | :mod:`.timm_pvt_v2` | ``pvt_v2.Attention`` (spatial reduction: keys from a smaller grid): stages |
| timm Twins | :mod:`.timm_twins` | ``LocallyGroupedAttn`` (windows), ``GlobalSubSampleAttn`` (reduced keys): stages |
| timm Next-ViT | :mod:`.timm_nextvit` | ``EfficientAttention`` (keys: means of runs of raster tokens): stages |
| timm MaxViT / CoAtNet | :mod:`.timm_maxvit` | MaxViT's ``AttentionCl`` / ``Attention2d`` in block and grid partitions, CoAtNet's ``Attention2d`` over the whole grid (relative-position bias or MLP), between MBConv blocks: stages |
| timm GC ViT | :mod:`.timm_gcvit` | ``WindowAttentionGlobal`` (window attention, every other block with the stage's global queries): stages |
| timm MViTv2 | :mod:`.timm_mvitv2` | ``MultiScaleAttention`` (pooled q and k on their own grids, class token, decomposed relative position from q): stages |
| timm SAM ViT | :mod:`.timm_sam` | SAM's ``Attention`` (14 × 14 windows and global blocks, decomposed relative position from q) |
| timm Hiera | :mod:`.timm_hiera` | ``MaskUnitAttention`` (mask units in Hiera's unrolled token order, pooled queries, then global): stages |
| timm HieraDet | :mod:`.timm_hieradet` | ``MultiScaleAttention`` (SAM 2's Hiera: windows or global, pooled queries): stages |
| timm ConViT | :mod:`.timm_convit` | ``GPSA`` (a gate blends a content and a positional softmax; parts on request), then ``MHSA``: stages |
| timm TNT | :mod:`.timm_tnt` | TNT's ``Attention``: inside each patch among its pixel tokens (windows on the fine grid), then over the class token and patches: stages |
| timm CrossViT | :mod:`.timm_crossvit` | ``Attention`` per branch, ``CrossAttention`` (a class token over the other branch's patches): one stage per branch |
| timm XCiT | :mod:`.timm_xcit` | CaiT's ``ClassAttn`` in ``ClassAttentionBlock`` (its ``XCA`` channel attention has no token map: unread) |
| timm VOLO | :mod:`.timm_volo` | ``volo.Attention``, then ``ClassAttention`` (its ``OutlookAttention`` has no query–key map: unread): stages |
| timm DaViT | :mod:`.timm_davit` | DaViT ``WindowAttention`` (its ``ChannelAttention`` blocks have no token map: unread): stages |
| Hugging Face (``hf:``) | :mod:`.hf` | ViT, DeiT, Dinov2, Dinov2WithRegisters, CLIP vision |
| generic (asked last) | :mod:`.generic` | any other PyTorch model's ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention`` calls; a call over one image's windows placed by its Swin-like module (Hugging Face's ``SwinModel``) |

Python builders (``module:callable``, ``py:``) are loaded by :mod:`.builder` and read by whichever family claims
the network they build. The hybrid ViTs and ViTamin (a CNN stem, ``HybridEmbed``, before plain blocks) are timm ViTs laid on
their stem's stride grid. Anything else (differential attention, an attention class we do not know) is refused with one sentence, never captured as a plausible but wrong
number; for timm's other families the sentence names what they have (:mod:`.refusals`).
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import cache

import torch

from ..errors import ModelError
from .base import Adapter
from .refusals import has_attention_module, known_refusal
from .registry import Family, attention_classes, register, registered
from .tap import Recorder, Tap

# Attention we know and cannot reproduce exactly yet: named in the refusal.
KNOWN_REFUSALS = {
    "timm.layers.diff_attention.DiffAttention": "differential attention",
}

__all__ = [
    "Adapter", "Family", "Recorder", "Tap",
    "adapter_for", "families", "family_of_name", "refusal", "register", "tap_of",
]


@cache
def _import_family_modules() -> None:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


def families() -> tuple[Family, ...]:
    """Every family: those of this package (each module registers its own on import), then any
    registered by hand, in registration order."""
    _import_family_modules()
    return registered()


def adapter_for(network: torch.nn.Module, size: int, grid: tuple[int, int] | None = None,
                prefix: int | None = None) -> Adapter:
    """The adapter that reads ``network`` exactly at S × S inputs, or a ModelError saying why not.

    ``grid`` (rows, columns of patches) and ``prefix`` (tokens before them) are for a network no family knows,
    read by the generic path (:mod:`.generic`) where its structure does not say its token layout."""
    unread = not_as_defined(network)
    if unread is not None:
        raise ModelError(unread)
    known = known_refusal(network)
    for family in families():
        if family.fallback and known is not None:
            break  # a timm family attnviz does not read: its own sentence below
        if family.claims(network):
            if family.fallback:
                return family.adapter(network, size, grid=grid, prefix=prefix)
            if grid is not None or prefix is not None:
                raise ModelError(f"grid= and prefix= are for models attnviz reads through their PyTorch attention "
                                 f"calls; {type(network).__name__} is read by the {family.name} family, which knows "
                                 "its token layout, so leave them out.")
            return family.adapter(network, size)
    raise ModelError(refusal(network))


def family_of_name(name: str | None) -> Family | None:
    """The family whose prefix starts ``name`` (``"hf:…"``: Hugging Face), which loads it itself;
    None for the default model and timm names."""
    if not name:
        return None
    return next((f for f in families() if f.prefix is not None and name.startswith(f.prefix)), None)


def not_as_defined(network: torch.nn.Module) -> str | None:
    """Why ``network`` does not compute what its classes define, in one sentence, or None when it does.

    An adapter reads a layer by what its class computes; a ``torch.compile`` wrapper (around the network or any
    module in it), or a module whose ``forward`` was replaced on the instance (``attn.forward = …``, also by
    another module's own forward), computes something else, and reading it by its class would give plausible
    but wrong weights (a patched timm ``Attention`` read 0.14–0.17 off).
    """
    for path, module in network.named_modules():
        where = f"{type(network).__name__}.{path}" if path else type(network).__name__
        compiled = getattr(module, "_orig_mod", None)
        if isinstance(compiled, torch.nn.Module) and type(module).__name__ == "OptimizedModule":
            if not path:
                return (f"This is a torch.compile'd {type(compiled).__name__}, whose compiled graph attnviz cannot hook; "
                        "pass the model before torch.compile (model._orig_mod) instead.")
            return (f"{where} is a torch.compile'd {type(compiled).__name__}, whose compiled graph attnviz cannot hook; "
                    f"put the module before torch.compile ({path}._orig_mod) back in its place.")
        replaced = vars(module).get("forward")
        # the class's own forward bound to this very module is no change; bound to another module (even a copy of
        # this one) it computes with that module's weights
        if replaced is not None and not (getattr(replaced, "__func__", None) is type(module).forward
                                         and getattr(replaced, "__self__", None) is module):
            return (f"{where} ({type(module).__name__}) has its forward replaced on the instance, so it does not "
                    f"compute what {type(module).__name__} defines and attnviz refuses it rather than show attention "
                    "weights that may be wrong; use the model without the patch.")
    return None


def _owned(cls: type) -> str:
    """A class's name, with its package's where timm has a class of that name (torchvision's VisionTransformer)."""
    import timm.models

    package = cls.__module__.split(".")[0]
    if package != "timm" and hasattr(timm.models, cls.__name__):
        return f"{package}'s {cls.__name__} (not timm's)"
    return cls.__name__


def refusal(network: torch.nn.Module) -> str:
    """Why no registered family reads ``network``, in one sentence."""
    net = _owned(type(network))
    blocks = getattr(network, "blocks", None)
    known = known_refusal(network)  # a timm family attnviz does not read: what it has instead
    if known is not None:
        return known
    if blocks is None or not len(blocks) or not hasattr(network, "patch_embed"):
        if has_attention_module(network):
            return (f"{net} has attention layers in an architecture attnviz does not know, so it refuses it "
                    "rather than show attention weights that may be wrong.")
        return (f"{net} is not a Vision Transformer attnviz can read "
                "(it has no patch embedding and transformer blocks).")
    if attention_classes(network) is None:
        block = next(b for b in blocks if getattr(b, "attn", None) is None)
        return (f"{type(block).__name__} blocks have no single attention module attnviz knows, so it refuses "
                f"{net} rather than show attention weights that may be wrong.")
    known = {cls for family in families() for cls in family.attention}
    unknown = next((type(b.attn) for b in blocks if type(b.attn) not in known), None)
    if unknown is None:
        return f"{net} mixes the attention of several model families, which attnviz cannot read as one model."
    name = f"{unknown.__module__}.{unknown.__qualname__}"
    what = KNOWN_REFUSALS.get(name, f"the attention in {name}")
    return (f"attnviz cannot yet reproduce {what} exactly, so it refuses {net} "
            "rather than show attention weights that may be wrong.")


def tap_of(network: torch.nn.Module, adapter: Adapter) -> Tap:
    """The hooks on ``network``, installed by the first wrap and shared by every later one (also by a
    deep copy's own). Reinstalled only if its attention or block modules have been replaced since."""
    modules = (*adapter.attentions, *adapter.blocks)
    tap = getattr(network, "_attnviz_tap", None)
    if tap is not None and len(tap.modules) == len(modules) and all(a is b for a, b in zip(tap.modules, modules)):
        return tap
    if tap is not None:
        tap.remove()
    tap = Tap(modules)
    for layer in range(adapter.depth):
        adapter.attach(layer, tap)
        if not adapter.blocks:  # the generic path: it reads the forward pass's attention calls, no module hooked
            continue
        tap.after(adapter.blocks[layer], layer, Recorder.put_tokens, adapter.tokens_reader(layer))
        heads = adapter.layouts[layer].num_heads if adapter.layouts is not None else adapter.num_heads
        meet = adapter.heads_meet(layer)
        if meet is not None:
            tap.switch(*meet, layer, heads)
    network._attnviz_tap = tap  # travels with the network: deepcopy and pickle copy it with the hooks
    return tap
