"""timm's NesT (Zhang et al. 2022, "Nested Hierarchical Transformer"): attention inside non-overlapping
blocks of patches, the blocks merged between levels.

Level i cuts its token grid into 4^(L−1−i) square blocks of b × b tokens (``blockify``; b is the same at
every level), and every transformer layer of the level attends inside each block only, with plain
scaled dot-product attention, softmax(q · kᵀ · d_k^−½), no position bias (the level adds its position
embedding once, before its first layer). Between levels a convolution and a 3 × 3 max pool of stride 2
(``ConvPool``) halve the grid, so four blocks become one; the last level is a single block (global
attention over its grid).

In attnviz's terms a NesT block is a window: layer l = (level, layer in the level), its grid the
level's grid, the windows the blocks in row-major order with their tokens in raster order, no shift.
The q and k are read at the output of the ``qkv`` projection, which the fused path uses unchanged.
A layer's output is (B, blocks, b², C); its tokens are put back in raster order (``deblockify``)
before their norms are kept.
"""
from __future__ import annotations

import math
from functools import partial

import torch
from timm.models.nest import Attention, Nest, TransformerLayer, deblockify

from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not Nest:
        return False
    layers = nest_layers(network)
    return bool(layers) and all(type(t) is TransformerLayer and type(t.attn) is Attention for t in layers)


def nest_layers(network: torch.nn.Module) -> list[torch.nn.Module]:
    return [layer for level in network.levels for layer in level.transformer_encoder]


def block_part(heads: int, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """(1, T, N, 3 · H · d_k) q, k, v of the one image's blocks → its q (part 0) or k (1): (H, T, N, d_k)."""
    _, t, n, _ = qkv.shape
    return qkv[0].reshape(t, n, 3, heads, -1)[:, :, part].permute(2, 0, 1, 3)


def raster_tokens(block_size: int, output: torch.Tensor) -> torch.Tensor:
    """A layer's (1, T, N, C) output → the (h · w, C) tokens of the one image, in raster order."""
    return deblockify(output, block_size)[0].flatten(0, 1)


class NestAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        qkv, heads = self.attentions[layer].qkv, self.layouts[layer].num_heads
        tap.after(qkv, layer, Recorder.put_query, partial(block_part, heads, 0))
        tap.after(qkv, layer, Recorder.put_key, partial(block_part, heads, 1))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    embed = network.patch_embed
    patch = embed.patch_size[0]
    check_square_size(net, patch, size, tuple(embed.img_size), dynamic=False)
    b = network.block_size
    layouts, attentions, blocks = [], [], []
    for s, level in enumerate(network.levels):
        side = b * math.isqrt(network.num_blocks[s])  # the level's grid: sqrt(blocks) × sqrt(blocks) blocks
        grid = (side, side)
        windows = window_partition_index(grid, (b, b), (0, 0))  # (blocks, b²): blockify's order
        for i, layer in enumerate(level.transformer_encoder):
            attn = layer.attn
            heads = attn.num_heads
            head_dim = attn.qkv.weight.shape[0] // 3 // heads
            layouts.append(LayerLayout(s, i, grid, size // side, (b, b), (0, 0), heads, head_dim,
                                       float(attn.scale), windows))
            attentions.append(attn)
            blocks.append(layer)
    first = layouts[0]
    return NestAdapter(
        family="timm NesT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=patch, embed_dim=embed.proj.out_channels,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=None,
        read_tokens=partial(raster_tokens, b),
    )


FAMILY = register(Family("timm NesT", adapter, recognises=recognises))
