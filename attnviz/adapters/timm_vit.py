"""timm's standard ``Attention`` (ViT, DeiT, DINO, DINOv2, register models).

``Attention.forward`` computes q, k = q_norm(q), k_norm(k) on both its fused (SDPA) and eager paths
and then softmax(q · kᵀ · scale) with no mask in a ViT's forward. So the outputs of ``q_norm`` and
``k_norm`` (``Identity`` in a plain ViT) are exactly the logits' q and k.

For class-specific relevance, :func:`eager_block` is ``Block.forward`` in eager arithmetic: it runs the
block's own modules and returns the attention weights inside the autograd graph.
"""
from __future__ import annotations

import torch
from timm.layers import Attention, HybridEmbed, PatchEmbed
from timm.models.vision_transformer import Block

from ..errors import ModelError, RelevanceError
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap

ATTENTION = (Attention,)


def layout(network: torch.nn.Module, size: int, head_dim: int | None = None) -> dict:
    """The token layout and shapes every timm ViT family shares (timm's own attribute names)."""
    if type(network).__name__ == "NaFlexVit":  # variable-size patch sequences, masked attention
        raise ModelError(
            "NaFlexViT masks its attention over padded patches, which attnviz cannot reproduce exactly yet."
        )
    embed = network.patch_embed
    if type(embed) is HybridEmbed:
        patch = hybrid_stride(network)
    elif type(embed) is PatchEmbed:
        patch = embed.patch_size[0] if isinstance(embed.patch_size, (tuple, list)) else int(embed.patch_size)
        if isinstance(embed.patch_size, (tuple, list)) and embed.patch_size[0] != embed.patch_size[1]:
            raise ModelError(f"{type(network).__name__} has non-square {embed.patch_size} patches, which attnviz cannot lay on a grid.")
    else:
        raise ModelError(token_layout_refusal(network))
    built = tuple(embed.img_size) if getattr(embed, "img_size", None) is not None else None
    dynamic = bool(getattr(network, "dynamic_img_size", False))
    check_square_size(type(network).__name__, patch, size, built, dynamic)
    first = network.blocks[0].attn
    return dict(
        attentions=tuple(block.attn for block in network.blocks),
        blocks=tuple(network.blocks),
        num_heads=first.num_heads,
        head_dim=first.head_dim if head_dim is None else head_dim,
        scale=float(first.scale),
        patch=patch,
        embed_dim=network.embed_dim,
        num_prefix_tokens=network.num_prefix_tokens,
        has_class_token=getattr(network, "cls_token", None) is not None,
    )


def hybrid_stride(network: torch.nn.Module) -> int:
    """The hybrid ViTs (``vit_*_r*_s*``) and ViTamin put a CNN before plain ViT blocks (``HybridEmbed``):
    token i is the CNN's feature at cell i of a grid of stride s = img_size / grid_size, so attention is
    laid on that grid as on s-pixel patches (each token sees more of the photo than its cell; its place
    on the grid is still exact)."""
    embed = network.patch_embed
    (ih, iw), (gh, gw) = tuple(embed.img_size), tuple(embed.grid_size)
    if ih % gh or iw % gw or ih // gh != iw // gw:
        raise ModelError(f"{type(network).__name__}'s convolutional stem maps {ih} × {iw} px to {gh} × {gw} tokens, "
                         "which is not one square cell of the photo per token, so attnviz cannot lay them on a grid.")
    return ih // gh


def token_layout_refusal(network: torch.nn.Module) -> str:
    """Why attnviz cannot tell which part of the photo each token of ``network`` is, in one sentence."""
    net, embed = type(network).__name__, network.patch_embed
    return (f"{net} makes its tokens with {type(embed).__name__}, not timm's PatchEmbed, so attnviz cannot tell "
            "which part of the photo each token is and refuses it rather than guess.")


def eager_block(block: Block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's ``Block.forward`` in eager arithmetic; returns the block output and its (B, H, N, N) attention."""
    attn = block.attn
    h = block.norm1(x)
    b, n, _ = h.shape
    gate = attn.gate(h).sigmoid() if getattr(attn, "gate", None) is not None else None
    qkv = attn.qkv(h).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each (B, H, N, d_k)
    q, k = attn.q_norm(q), attn.k_norm(k)
    weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, H, N, N)
    out = (weights @ v).transpose(1, 2).reshape(b, n, attn.attn_dim)  # (B, N, H · d_k)
    out = attn.norm(out)
    if gate is not None:
        out = out * gate
    x = x + block.ls1(attn.proj(out))
    x = x + block.ls2(block.mlp(block.norm2(x)))
    return x, weights


class TimmAdapter(Adapter):
    """Reads q and k at each attention's ``q_norm`` / ``k_norm``."""

    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        tap.after(attn.q_norm, layer, Recorder.put_query)
        tap.after(attn.k_norm, layer, Recorder.put_key)

    def eager_refusal(self, network: torch.nn.Module) -> str | None:
        for block in self.blocks:
            # Only timm's exact Block / Attention computation is written out in eager_block. RoPE and
            # relative-position blocks are captured exactly, but their gradients would need their own
            # eager forward: refused, not approximated.
            if type(block).forward is not Block.forward or type(block.attn).forward is not Attention.forward:
                return (f"{type(block).__name__} blocks are not timm's standard ViT block; "
                        "class-specific maps support plain timm Vision Transformers only.")
        return None

    def attention_forward(
        self, network: torch.nn.Module, x: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's ``VisionTransformer.forward`` (eval mode) through :func:`eager_block`."""
        reason = self.eager_refusal(network)
        if reason is not None:
            raise RelevanceError(reason)
        x = network.patch_embed(x)
        x = network._pos_embed(x)
        x = network.patch_drop(x)
        x = network.norm_pre(x)  # (B, N, D)
        attentions = []
        for block in self.blocks:
            x, weights = eager_block(block, x)
            attentions.append(weights)
        x = network.norm(x)
        return network.forward_head(x), attentions


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    return TimmAdapter(family="timm ViT", **layout(network, size))


FAMILY = register(Family("timm ViT", adapter, attention=ATTENTION))
