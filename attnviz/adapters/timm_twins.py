"""timm's Twins (Chu et al. 2021, "Twins: Revisiting the Design of Spatial Attention in Vision
Transformers"): four stages of attention over a shrinking token grid.

- Twins-SVT alternates locally grouped attention (LSA, ``LocallyGroupedAttn``: attention inside
  non-overlapping ws × ws windows of the stage's grid, no shift, no bias) with global sub-sampled
  attention (GSA, ``GlobalSubSampleAttn``: every token attends to keys from the grid reduced by a
  convolution of kernel and stride R, then a LayerNorm, as in PVT);
- Twins-PCPVT has GSA only.

The weights are softmax(q · kᵀ · d_k^−½). LSA's q and k are read at the output of ``qkv`` (applied to
the windows the module cut); GSA's q at ``q`` and k at the first half of ``kv``: the tensors SDPA is given.

The capture is a :class:`attnviz.Capture` with its own layouts: layer l = (stage, block); an LSA layer has the
windows of its grid, a GSA layer one window with its keys on the reduced grid.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.twins import GlobalSubSampleAttn, LocallyGroupedAttn, Twins

from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_windows
from .registry import Family, register
from .tap import Recorder, Tap
from .timm_pvt_v2 import check_stride, global_layout, heads_of, reduced_grid
from .timm_swin import window_part

ATTENTIONS = (LocallyGroupedAttn, GlobalSubSampleAttn)


def recognises(network: torch.nn.Module) -> bool:
    return type(network) is Twins and all(type(block.attn) in ATTENTIONS for stage in network.blocks for block in stage)


def windowed_part(heads: int, window: int, part: int, output: torch.Tensor) -> torch.Tensor:
    """LSA's (1, h / ws, w / ws, ws, ws, 3 · H · d_k) qkv → the one image's q (part 0) or k (1): (H, W, T, d_k)."""
    return window_part(heads, part, output[0].reshape(-1, window * window, output.shape[-1]))


class TwinsAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        heads = attn.num_heads
        if type(attn) is LocallyGroupedAttn:
            tap.after(attn.qkv, layer, Recorder.put_query, partial(windowed_part, heads, attn.ws, 0))
            tap.after(attn.qkv, layer, Recorder.put_key, partial(windowed_part, heads, attn.ws, 1))
        else:
            tap.after(attn.q, layer, Recorder.put_query, partial(heads_of, heads, 1, 0))
            tap.after(attn.kv, layer, Recorder.put_key, partial(heads_of, heads, 2, 0))


def local_layout(net: str, stage: int, block: int, grid: tuple[int, int], patch: int,
                 attn: LocallyGroupedAttn) -> LayerLayout:
    ws = attn.ws
    check_windows(net, grid[0] * patch, f"stage {stage + 1}", grid, (ws, ws))
    heads = attn.num_heads
    return LayerLayout(stage, block, grid, patch, (ws, ws), (0, 0), heads, attn.dim // heads, float(attn.scale),
                       windows=window_partition_index(grid, (ws, ws), (0, 0)))  # (W, T)


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    strides = [embed.patch_size[0] for embed in network.patch_embeds]
    stride = 1
    for s in strides:
        stride *= s
    check_stride(net, stride, size)
    layouts, attentions, blocks = [], [], []
    side = size
    for s, (embed, stage) in enumerate(zip(network.patch_embeds, network.blocks)):
        side //= embed.patch_size[0]
        grid, patch = (side, side), size // side
        for b, block in enumerate(stage):
            attn = block.attn
            if type(attn) is LocallyGroupedAttn:
                layouts.append(local_layout(net, s, b, grid, patch, attn))
            else:
                key_grid = None if attn.sr is None else reduced_grid(net, size, s, grid, attn.sr.stride[0])
                layouts.append(global_layout(s, b, grid, patch, attn.num_heads, attn.dim // attn.num_heads,
                                             float(attn.scale), key_grid))
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return TwinsAdapter(
        family="timm Twins", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=first.patch, embed_dim=network.embed_dims[0],
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts),
    )


FAMILY = register(Family("timm Twins", adapter, recognises=recognises))
