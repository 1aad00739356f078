"""timm's SHViT (Yun & Ro 2024, "SHViT: Single-Head Vision Transformer with Memory Efficient Macro
Design"): a 16 × convolutional stem, then stages of depthwise-convolution, attention and FFN blocks.

Each attention block (``BasicBlock`` of type "s", its ``mixer`` a ``Residual(SHSA)``) attends with one
head over every cell of its stage's (h, w) feature map (one window, W = 1), on the first ``pdim``
channels only (the rest pass by the attention untouched): after a GroupNorm, ``qkv`` (a 1 × 1
convolution and a BatchNorm) gives (1, 2 · d_qk + pdim, h, w), split into q, k, v along the channels
and flattened over (h, w) in raster order, and the weights are softmax(qᵀ · k · d_qk^−½). timm computes
this softmax eagerly (there is no fused path), so q and k are read at the output of ``qkv``.
Blocks of type "i" have no attention and are not layers. The blocks' outputs are (1, C, h, w), read
channels first. The network is convolutional and takes any size that is a multiple of its 16 px
stem; where a stage's stride-2 convolution meets an odd grid (7 × 7 at 224 px) it gives ⌈h / 2⌉ cells,
each centred on a cell of the grid before (no cell made of padding alone).

The capture is a :class:`attnviz.Capture` with its own layouts: one layer per attention block, at its stage's grid.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.shvit import SHSA, SHViT, BasicBlock, Residual

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter
from .registry import Family, register
from .tap import Recorder, Tap, channels_first

STEM = 16  # four stride-2 convolutions


def attention_blocks(network: torch.nn.Module) -> list[tuple[int, int, torch.nn.Module]]:
    """(stage, index among that stage's attention blocks, block) of every block with attention, in order."""
    out = []
    for s, stage in enumerate(network.stages):
        found = [b for b in stage.blocks if isinstance(b.mixer, Residual)]
        out += [(s, i, block) for i, block in enumerate(found)]
    return out


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not SHViT:
        return False
    blocks = [b for stage in network.stages for b in stage.blocks]
    found = attention_blocks(network)
    return (bool(found) and all(type(b) is BasicBlock for b in blocks)
            and all(type(b.mixer) is Residual and type(b.mixer.m) is SHSA for _, _, b in found))


def channel_part(attn: SHSA, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """(1, 2 · d_qk + pdim, h, w) output of ``qkv`` → its q (part 0) or k (1) as (1, 1, h · w, d_qk), split
    along the channels as ``SHSA.forward`` splits it, then tokens before channels."""
    d = attn.qk_dim
    return qkv[0, part * d:(part + 1) * d].flatten(1).transpose(0, 1)[None, None]


class SHViTAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        tap.after(attn.qkv, layer, Recorder.put_query, partial(channel_part, attn, 0))
        tap.after(attn.qkv, layer, Recorder.put_key, partial(channel_part, attn, 1))


def stage_grids(network: torch.nn.Module, side: int) -> list[int]:
    """Each stage's grid side for an input of ``side`` / 16 cells after the stem: a stage that changes the
    width downsamples with a 3 × 3, stride-2, padding-1 convolution (⌈n / 2⌉ cells)."""
    out = []
    for stage in network.stages:
        if not isinstance(stage.downsample, torch.nn.Identity):
            side = (side + 1) // 2
        out.append(side)
    return out


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ModelError(f"The input size must be a positive whole number of pixels, not {size!r}.")
    if size % STEM:
        raise ModelError(f"The input size must be a multiple of {net}'s {STEM} px stem; {size} px is not.")
    sides = stage_grids(network, size // STEM)
    layouts, attentions, blocks = [], [], []
    for s, b, block in attention_blocks(network):
        attn = block.mixer.m
        grid = (sides[s], sides[s])
        windows = torch.arange(grid[0] * grid[1])[None]  # one window of every cell, in raster order
        layouts.append(LayerLayout(s, b, grid, size // grid[0], grid, (0, 0), 1, attn.qk_dim, float(attn.scale),
                                   windows))
        attentions.append(attn)
        blocks.append(block)
    one = layouts[0]
    return SHViTAdapter(
        family="timm SHViT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=1,
        head_dim=one.head_dim, scale=one.scale, patch=STEM, embed_dim=network.num_features, num_prefix_tokens=0,
        has_class_token=False, layouts=tuple(layouts), read_tokens=channels_first,
    )


FAMILY = register(Family("timm SHViT", adapter, recognises=recognises))
