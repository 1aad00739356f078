"""One adapter per model family: what are this layer's exact attention logits?

The capture hooks a network only through its adapter and never asks which family it is. Each
adapter knows which modules to hook to read every layer's queries and keys, how to turn what it read
into the exact q and k that enter softmax(q · kᵀ · scale + bias), the additive logit bias if the
family has one, and the token layout (patch size, prefix tokens, whether token 0 is a class token).

| family | module | attention classes |
|---|---|---|
| timm ViT | :mod:`.timm_vit` | ``timm.layers.Attention`` (ViT, DeiT, DINO, DINOv2, registers) |
| timm RoPE | :mod:`.timm_rope` | ``EvaAttention``, ``AttentionRope`` (EVA-02, DINOv3, PE, ``vit_*_rope*``) |
| timm relative position | :mod:`.timm_relpos` | ``RelPosAttention`` (``vit_relpos_*``, ``vit_srelpos_*``) |
| Hugging Face | :mod:`.hf` | ViT, DeiT, Dinov2, Dinov2WithRegisters, CLIP vision |

Anything else (SAM's windowed attention, differential attention, an attention class we do not
know) is refused with one sentence, never captured as a plausible but wrong number.
"""
from __future__ import annotations

import torch

from ..errors import ModelError
from .base import Adapter, Recorder
from . import hf, timm_relpos, timm_rope, timm_vit

TIMM_FAMILIES = (timm_vit, timm_rope, timm_relpos)

# Attention we know and cannot reproduce exactly yet: named in the refusal.
KNOWN_REFUSALS = {
    "timm.models.vision_transformer_sam.Attention": "SAM's windowed attention",
    "timm.layers.diff_attention.DiffAttention": "differential attention",
}

__all__ = ["Adapter", "Recorder", "adapter_for"]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def adapter_for(network: torch.nn.Module, size: int) -> Adapter:
    """The adapter that reads ``network`` exactly at S × S inputs, or a ModelError saying why not."""
    if hf.is_hf(network):
        return hf.adapter(network, size)
    blocks = getattr(network, "blocks", None)
    if blocks is None or not len(blocks) or not hasattr(network, "patch_embed"):
        raise ModelError(
            f"{type(network).__name__} is not a Vision Transformer attnviz can read "
            "(it has no patch embedding and transformer blocks)."
        )
    if type(network).__name__ == "NaFlexVit":  # variable-size patch sequences, masked attention
        raise ModelError("NaFlexViT masks its attention over padded patches, which attnviz cannot reproduce exactly yet.")
    attns = [getattr(block, "attn", None) for block in blocks]
    if any(a is None for a in attns):
        block = next(b for b, a in zip(blocks, attns) if a is None)
        raise ModelError(
            f"{type(block).__name__} blocks have no single attention module attnviz knows, so it refuses "
            f"{type(network).__name__} rather than show attention weights that may be wrong."
        )
    kinds = {type(a) for a in attns}
    for family in TIMM_FAMILIES:
        if kinds <= set(family.ATTENTION):
            return family.adapter(network, size)
    unknown = next(type(a) for a in attns if not any(type(a) in f.ATTENTION for f in TIMM_FAMILIES))
    what = KNOWN_REFUSALS.get(_qualified(unknown), f"the attention in {_qualified(unknown)}")
    raise ModelError(
        f"attnviz cannot yet reproduce {what} exactly, so it refuses {type(network).__name__} "
        "rather than show attention weights that may be wrong."
    )
