"""timm's TNT, Transformer in Transformer (Han et al. 2021): each block attends among the "pixel" tokens
inside every patch (the inner transformer), then among the class token and the patches (the outer one).

``PixelEmbed`` turns the photo into a fine grid of pixel tokens, one per ``stride`` px (4 in timm's TNTs):
the legacy models convolve the whole photo and cut the (S/4) × (S/4) feature map into p × p pieces with
``nn.Unfold`` (p = ceil(patch / stride), 4 for 16 px patches); the others cut the photo into patches with
``nn.Unfold`` and convolve each patch to p × p. Either way patch n (raster order of the patch grid) holds
the p × p pixel tokens of its own square of the fine grid, in raster order inside it: the inner attention
is window attention on the fine grid with p × p windows, one per patch, in the patch grid's raster order
(Swin's ``window_partition`` without a shift). Its softmax is (patches, H_in, p², p²), windows first.

The outer attention is one window of every token, the class token first (``prefix`` 1), on the patch
grid. Both are ``tnt.Attention``: softmax((q · kᵀ) · d_k^−½) with q, k the two halves of ``qk``'s output,
computed eagerly (the module has no fused path). q and k are read at ``qk``'s output.

The capture is a :class:`attnviz.Capture` with its own layouts in the model's order of softmaxes, two layers per
TNT block: layer 2b is (stage 0, block b), block b's inner attention on the fine pixel grid; layer 2b + 1
is (stage 1, block b), its outer attention on the patch grid. Stage 0's summary map is the attention each
pixel receives inside its patch; stage 1's is the class token's row. Token norms: the pixel tokens after
block b's inner part (on the fine grid, raster order) for stage 0, the class token and patches after the
block for stage 1.
"""
from __future__ import annotations

import math
from functools import partial

import torch
from timm.models.tnt import TNT, Attention, Block, PixelEmbed

from ..errors import ModelError
from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not TNT or type(network.pixel_embed) is not PixelEmbed:
        return False
    return all(type(b) is Block and type(b.attn_in) is Attention and type(b.attn_out) is Attention
               for b in network.blocks)


def qk_part(heads: int, part: int, qk: torch.Tensor) -> torch.Tensor:
    """``qk`` output (W, T, 2 · H · d_k) (W = patches for the inner attention, 1 image for the outer) →
    q (part 0) or k (1): (H, W, T, d_k), as ``Attention.forward`` reshapes it to (2, W, H, T, d_k)."""
    w, t = qk.shape[:2]
    return qk.reshape(w, t, 2, heads, -1)[:, :, part].permute(2, 0, 1, 3)


def pixel_tokens(patches: tuple[int, int], side: int, output: tuple) -> torch.Tensor:
    """A block's output (pixel tokens (N, p², C_in), patch tokens) → the pixel tokens in the fine grid's
    raster order, (N · p², C_in)."""
    (gh, gw), pixels = patches, output[0]
    return pixels.reshape(gh, gw, side, side, -1).permute(0, 2, 1, 3, 4).reshape(gh * side * gw * side, -1)


def patch_tokens(output: tuple) -> torch.Tensor:
    """A block's output → the (1 + N, D) class token and patches of the one image."""
    return output[1][0]


class TntAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        qk, heads = self.attentions[layer].qk, self.layouts[layer].num_heads
        tap.after(qk, layer, Recorder.put_query, partial(qk_part, heads, 0))
        tap.after(qk, layer, Recorder.put_key, partial(qk_part, heads, 1))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    embed = network.pixel_embed
    patch = embed.patch_size[0]
    if embed.patch_size[0] != embed.patch_size[1]:
        raise ModelError(f"{net} has non-square {tuple(embed.patch_size)} patches, which attnviz cannot lay on a grid.")
    side = embed.new_patch_size[0]  # p: pixel tokens per patch side
    if patch % side:
        raise ModelError(f"{net}'s {patch} px patches hold {side} × {side} pixel tokens, which do not tile them "
                         "evenly, so attnviz cannot lay its pixel tokens on the photo.")
    check_square_size(net, patch, size, None, dynamic=False)
    built = tuple(embed.img_size)
    if built[0] != built[1]:
        raise ModelError(f"{net} was built for {built[0]} × {built[1]} px inputs; attnviz needs a square input "
                         "(build it with a square img_size).")
    if size != built[0]:
        raise ModelError(f"{net} was built for {built[0]} px inputs (its position embedding is a fixed "
                         f"{built[0] // patch} × {built[1] // patch} grid), not {size} px; build it with img_size={size}.")
    patches = (size // patch, size // patch)
    fine = (patches[0] * side, patches[1] * side)
    inner = window_partition_index(fine, (side, side), (0, 0))  # (N, p²): patch n's pixel tokens
    every = torch.arange(1 + patches[0] * patches[1])[None]  # (1, 1 + N): the class token, then the patches
    layouts, attentions, blocks, readers = [], [], [], []
    for b, block in enumerate(network.blocks):
        for stage, attn in enumerate((block.attn_in, block.attn_out)):
            heads = attn.num_heads
            if stage == 0:
                lay = LayerLayout(0, b, fine, patch // side, (side, side), (0, 0), heads, attn.head_dim,
                                  float(attn.scale), inner)
                readers.append(partial(pixel_tokens, patches, side))
            else:
                lay = LayerLayout(1, b, patches, patch, patches, (0, 0), heads, attn.head_dim, float(attn.scale),
                                  every, prefix=1, class_token=True)
                readers.append(patch_tokens)
            if attn.qk.weight.shape[0] != 2 * heads * attn.head_dim or not math.isfinite(attn.scale):
                raise ModelError(f"{net}'s attention splits its queries and keys in a way attnviz does not know.")
            layouts.append(lay)
            attentions.append(attn)
            blocks.append(block)
    outer = layouts[1]
    return TntAdapter(
        family="timm TNT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=outer.num_heads,
        head_dim=outer.head_dim, scale=outer.scale, patch=patch, embed_dim=network.embed_dim,
        num_prefix_tokens=1, has_class_token=True, layouts=tuple(layouts), read_tokens=tuple(readers),
    )


FAMILY = register(Family("timm TNT", adapter, recognises=recognises))
