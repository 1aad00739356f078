"""timm's standard ``Attention`` (ViT, DeiT, DINO, DINOv2, register models).

``Attention.forward`` computes q, k = q_norm(q), k_norm(k) on both its fused (SDPA) and eager paths
and then softmax(q · kᵀ · scale) with no mask in a ViT's forward. So the outputs of ``q_norm`` and
``k_norm`` (``Identity`` in a plain ViT) are exactly the logits' q and k.
"""
from __future__ import annotations

import torch
from timm.layers import Attention

from .base import Adapter, Recorder, check_square_size

ATTENTION = (Attention,)


def layout(network: torch.nn.Module, size: int) -> dict:
    """The token layout and shapes every timm ViT family shares (timm's own attribute names)."""
    embed = network.patch_embed
    patch = embed.patch_size[0] if isinstance(embed.patch_size, (tuple, list)) else int(embed.patch_size)
    if isinstance(embed.patch_size, (tuple, list)) and embed.patch_size[0] != embed.patch_size[1]:
        from ..errors import ModelError

        raise ModelError(f"{type(network).__name__} has non-square {embed.patch_size} patches, which attnviz cannot lay on a grid.")
    built = tuple(embed.img_size) if getattr(embed, "img_size", None) is not None else None
    dynamic = bool(getattr(network, "dynamic_img_size", False))
    check_square_size(type(network).__name__, patch, size, built, dynamic)
    first = network.blocks[0].attn
    return dict(
        attentions=tuple(block.attn for block in network.blocks),
        blocks=tuple(network.blocks),
        num_heads=first.num_heads,
        head_dim=first.head_dim,
        scale=float(first.scale),
        patch=patch,
        embed_dim=network.embed_dim,
        num_prefix_tokens=network.num_prefix_tokens,
        has_class_token=getattr(network, "cls_token", None) is not None,
    )


class TimmAdapter(Adapter):
    """Reads q and k at each attention's ``q_norm`` / ``k_norm``."""

    def attach(self, layer: int, recorder: Recorder) -> list:
        attn = self.attentions[layer]
        return [
            attn.q_norm.register_forward_hook(lambda _m, _i, out: recorder.put_query(layer, out[0])),
            attn.k_norm.register_forward_hook(lambda _m, _i, out: recorder.put_key(layer, out[0])),
        ]


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    return TimmAdapter(family="timm ViT", **layout(network, size))
