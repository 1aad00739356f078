"""timm's Pyramid Vision Transformer v2 (Wang et al. 2021, "PVT v2: Improved Baselines with Pyramid
Vision Transformer"): spatial-reduction attention in four stages.

Every query token of a stage's h × w grid attends to every key, one window (W = 1), but the keys and
values come from a smaller grid: the block's input laid out as (C, h, w) is reduced by a convolution of
kernel and stride R (the stage's ``sr_ratio``), then a LayerNorm, to an (h / R) × (w / R) grid, and
``kv`` projects those. The linear variants (``pvt_v2_b2_li``) pool adaptively to 7 × 7 instead
(then a 1 × 1 convolution, LayerNorm and GELU). The weights are softmax(q · kᵀ · d_k^−½), with q read
at the output of ``q`` and k at the first half of the output of ``kv``: the tensors SDPA is given.

The capture is a :class:`attnviz.Capture` with its own layouts: layer l = (stage, block), each with its query
grid and the grid of its reduced keys (``key_grid``).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.pvt_v2 import Attention, PyramidVisionTransformerV2

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    return type(network) is PyramidVisionTransformerV2 and all(
        type(block.attn) is Attention for stage in network.stages for block in stage.blocks)


def heads_of(heads: int, parts: int, part: int, output: torch.Tensor) -> torch.Tensor:
    """A (1, N, parts · H · d_k) projection's output (``q``: 1 part; ``kv``: 2, k first) → part ``part`` of
    the one image's tokens as one window: (H, 1, N, d_k)."""
    n = output.shape[1]
    return output[0].reshape(n, parts, heads, -1)[:, part].permute(1, 0, 2)[:, None]


def global_layout(stage: int, block: int, grid: tuple[int, int], patch: int, heads: int, head_dim: int,
                  scale: float, key_grid: tuple[int, int] | None) -> LayerLayout:
    """Every query token of ``grid`` attends to every key of ``key_grid`` (None: the same grid): one window."""
    keys = grid if key_grid is None else key_grid
    return LayerLayout(
        stage, block, grid, patch, grid, (0, 0), heads, head_dim, scale,
        windows=torch.arange(grid[0] * grid[1])[None],  # (1, Tq)
        key_windows=None if key_grid is None else torch.arange(keys[0] * keys[1])[None],  # (1, Tk)
        key_grid=key_grid,
    )


def conv_out(side: int, conv: torch.nn.Conv2d) -> int:
    return (side + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1


def check_stride(net: str, stride: int, size: int) -> None:
    """One sentence when the stages' strided embeddings would reach past the photo at ``size`` px."""
    check_square_size(net, stride, size, None, dynamic=True)


def reduced_grid(net: str, size: int, stage: int, grid: tuple[int, int], ratio: int) -> tuple[int, int]:
    """The (h / R) × (w / R) grid a kernel-and-stride-R reduction makes of ``grid``; one sentence when R
    does not divide it (the reduction would drop the last rows or columns of tokens from the keys)."""
    if grid[0] % ratio or grid[1] % ratio:
        raise ModelError(
            f"At {size} px, stage {stage + 1} of {net} has a {grid[0]} × {grid[1]} token grid that its "
            f"{ratio} × {ratio} spatial reduction does not divide, so its keys leave out the last tokens of "
            "the photo; attnviz refuses that size rather than show keys for only part of it (use a size "
            "where every stage divides).")
    return grid[0] // ratio, grid[1] // ratio


class PvtV2Adapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        heads = attn.num_heads
        tap.after(attn.q, layer, Recorder.put_query, partial(heads_of, heads, 1, 0))
        tap.after(attn.kv, layer, Recorder.put_key, partial(heads_of, heads, 2, 0))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    stride = network.patch_embed.proj.stride[0] * 2 ** (len(network.stages) - 1)
    check_stride(net, stride, size)
    side = conv_out(size, network.patch_embed.proj)
    layouts, attentions, blocks = [], [], []
    for s, stage in enumerate(network.stages):
        if stage.downsample is not None:
            side = conv_out(side, stage.downsample.proj)
        grid = (side, side)
        for b, block in enumerate(stage.blocks):
            attn = block.attn
            if attn.pool is not None:  # linear SRA: adaptive average pooling to a fixed grid
                key_grid = tuple(attn.pool.output_size) if isinstance(attn.pool.output_size, tuple) else (
                    attn.pool.output_size, attn.pool.output_size)
            elif attn.sr is not None:
                key_grid = reduced_grid(net, size, s, grid, attn.sr.stride[0])
            else:
                key_grid = None
            layouts.append(global_layout(s, b, grid, size // side, attn.num_heads, attn.head_dim,
                                         float(attn.scale), key_grid))
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return PvtV2Adapter(
        family="timm PVT v2", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=first.patch, embed_dim=network.stages[0].blocks[0].attn.dim,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts),
    )


FAMILY = register(Family("timm PVT v2", adapter, recognises=recognises))
