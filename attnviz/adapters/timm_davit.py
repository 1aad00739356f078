"""timm's DaViT, Dual Attention Vision Transformers (Ding et al. 2022): spatial window attention blocks
alternating with channel attention blocks, in four stages.

Each stage's ``SpatialBlock`` attends inside non-overlapping windows of T = wh · ww tokens of the stage's
grid (``WindowAttention``: softmax(q · kᵀ · d_k^−½) per window, no position bias, no shift, on timm's
fused SDPA path); its windows are Swin's ``window_partition`` of the (h, w) grid, windows in row-major
order. q and k are read at the output of ``qkv``. Its ``ChannelBlock`` (``ChannelAttention``) takes a
softmax over each head's channels (a d_k × d_k matrix), not over tokens, so it has no token map and
attnviz does not read it; the page says so in one sentence (``unread``).

A grid that does not divide into windows is padded with tokens that are not in the photo (and the stem
and downsampling pad odd sizes): attnviz refuses such sizes. The capture is a
:class:`attnviz.Capture` with its own layouts: layer l = (stage, spatial block), one grid per stage; a block's
output is NCHW (``channels_first``).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.davit import ChannelBlock, DaVit, SpatialBlock, WindowAttention

from ..errors import ModelError
from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap, channels_first
from .timm_swin import window_part

UNREAD = "stages.unread_davit"


def blocks_of(network: torch.nn.Module) -> list[list[torch.nn.Module]]:
    """Per stage, its blocks in forward order (each of ``stage.blocks`` is a Sequential of dual blocks)."""
    return [[b for dual in stage.blocks for b in dual] for stage in network.stages]


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not DaVit:
        return False
    blocks = [b for stage in blocks_of(network) for b in stage]
    known = all(type(b) in (SpatialBlock, ChannelBlock) for b in blocks)
    spatial = [b for b in blocks if type(b) is SpatialBlock]
    return known and bool(spatial) and all(type(b.attn) is WindowAttention for b in spatial)


class DavitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        heads = self.layouts[layer].num_heads
        qkv = self.attentions[layer].qkv
        tap.after(qkv, layer, Recorder.put_query, partial(window_part, heads, 0))
        tap.after(qkv, layer, Recorder.put_key, partial(window_part, heads, 1))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    stride = network.stem.stride[0]
    steps = [stride] + [stage.downsample.conv.stride[0] for stage in list(network.stages)[1:]]
    last = 1
    for step in steps:
        last *= step
    check_square_size(net, 1, size, None, dynamic=True)
    if size % last:  # the stem and each downsampling pad a side they do not divide
        raise ModelError(f"The input size must be a multiple of {last} px, the side of {net}'s tokens at its last "
                         f"stage (it pads other sizes with pixels that are not in the photo); {size} px is not.")
    layouts, attentions, blocks = [], [], []
    patch = 1
    for s, (stage, step) in enumerate(zip(blocks_of(network), steps)):
        patch *= step
        grid = (size // patch, size // patch)
        spatial = [b for b in stage if type(b) is SpatialBlock]
        for b, block in enumerate(spatial):
            window = tuple(block.window_size)
            if grid[0] % window[0] or grid[1] % window[1]:
                raise ModelError(
                    f"At {size} px, stage {s + 1} of {net} has a {grid[0]} × {grid[1]} token grid that does not "
                    f"divide into {window[0]} × {window[1]} windows, so the model pads it with tokens that are not in "
                    "the photo; attnviz refuses that size rather than show them (use a size where every stage "
                    "divides).")
            attn = block.attn
            heads = attn.num_heads
            head_dim = attn.qkv.weight.shape[0] // 3 // heads
            windows = window_partition_index(grid, window, (0, 0))  # (W, T)
            layouts.append(LayerLayout(s, b, grid, patch, window, (0, 0), heads, head_dim, float(attn.scale), windows))
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return DavitAdapter(
        family="timm DaViT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=steps[0], embed_dim=network.num_features,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), read_tokens=channels_first,
        unread=UNREAD,
    )


FAMILY = register(Family("timm DaViT", adapter, recognises=recognises))
