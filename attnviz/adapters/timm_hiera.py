"""timm's Hiera (Ryali et al. 2023, "Hiera: A Hierarchical Vision Transformer without the Bells-and-Whistles"):
mask-unit attention in the early stages, global attention in the later ones, queries max-pooled at each
stage transition.

Hiera does not keep its tokens in raster order. After the patch embedding it *unrolls* them (``Unroll``):
the patch grid's (2, 2) strides are moved to the front, once per pooled stage, so that every mask unit
(8 × 8 patches at 224 px) is a strided run of the sequence and a 2 × 2 max pool is ``x.view(B, 4, −1,
C).amax(1)``. ``MaskUnitAttention`` then attends inside each of the W mask units: token n of the sequence
is row n // W of window n % W (``reshape(B, −1, W, …)``). At the first block of a pooled stage the
queries are max-pooled the same way inside each window (``q.view(…, q_stride, −1, d).amax``): the keys
are the previous stage's tokens of the window, the queries the next stage's. In the global stages the
whole sequence is one window.

The raster cell of every position of the sequence, at every block's input and output, is read from the
model's own ``Reroll`` (which undoes the unroll, ``undo_windowing`` included) applied to an arange
sequence; nothing of the order is re-derived here. A layer's ``windows[w, t]`` is the raster cell, on its
(pooled) query grid, of row t of window w, and ``key_windows[w, t]`` that of column t on the key grid.

The weights are softmax(q · kᵀ · d_k^−½), no bias. q and k are read at the output of the ``qkv``
projection (the fused SDPA path uses the same q and k) and the queries pooled there with the model's own
``amax``, which picks values and so is exact. A block's output is put back in raster order before its
token norms are kept.

The capture is a :class:`attnviz.Capture` with its own layouts: layer l = (stage, block), the stage that the block
belongs to in timm's ``stages`` (the first block of a stage is the pooling one).
"""
from __future__ import annotations

import math
from functools import partial

import torch
from timm.models.hiera import Hiera, HieraBlock, MaskUnitAttention

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    return (type(network) is Hiera and bool(len(network.blocks))
            and all(type(b) is HieraBlock and type(b.attn) is MaskUnitAttention for b in network.blocks))


def window_part(attn: MaskUnitAttention, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """The ``qkv`` output (1, N, 3 · H · d) → q (part 0, pooled as the model pools it) or k (part 1) of
    every window: (H, W, T, d), the reshapes of ``MaskUnitAttention.forward``."""
    b, n, _ = qkv.shape
    heads, d = attn.heads, attn.head_dim
    windows = n // (attn.q_stride * attn.window_size) if attn.use_mask_unit_attn else 1
    x = qkv.reshape(b, -1, windows, 3, heads, d).permute(3, 0, 4, 2, 1, 5)[part]  # (1, H, W, T, d)
    if part == 0 and attn.q_stride > 1:
        x = x.reshape(b, heads, windows, attn.q_stride, -1, d).amax(dim=3)
    return x[0]


def raster_tokens(orders: dict[int, torch.Tensor], output: torch.Tensor) -> torch.Tensor:
    """A block's (1, N, C) output in Hiera's unrolled order → its (N, C) tokens in raster order
    (``orders[N][r]``: the position in the sequence of raster cell r)."""
    x = output[0]
    return x[orders[x.shape[0]].to(x.device)]


@torch.no_grad()
def raster_cells(network: Hiera, block: int) -> tuple[tuple[int, int], torch.Tensor]:
    """(grid, cells) of block ``block``'s output: ``cells[n]`` is the raster cell of position n of the
    sequence, found by rolling an arange sequence back to the grid with the model's own ``Reroll``."""
    _, size = network.reroll.schedule[block]
    n = math.prod(size)
    position = network.reroll(torch.arange(n, dtype=torch.float64).view(1, n, 1), block)  # (1, h, w, 1)
    position = position.reshape(-1).long()  # raster cell r holds position position[r]
    cells = torch.empty(n, dtype=torch.long)
    cells[position] = torch.arange(n)
    return tuple(size), cells


class HieraAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        tap.after(attn.qkv, layer, Recorder.put_query, partial(window_part, attn, 0))
        tap.after(attn.qkv, layer, Recorder.put_key, partial(window_part, attn, 1))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    stride = tuple(network.patch_stride)
    if len(stride) != 2:
        raise ModelError(f"{net} is built for {len(stride)}-dimensional inputs (video); attnviz reads images only.")
    built = tuple(s * p for s, p in zip(network.tokens_spatial_shape, stride))
    check_square_size(net, stride[0], size, built, dynamic=True)  # no dynamic size: its own sentence below
    if built[0] != size:
        grid = network.tokens_spatial_shape
        raise ModelError(f"{net} was built for {built[0]} px inputs, not {size} px (its position embedding and token "
                         f"order are fixed to a {grid[0]} × {grid[1]} token grid); build it with img_size={size}.")
    if any(t % m for t, m in zip(network.tokens_spatial_shape, network.mask_unit_size)):
        raise ModelError(f"{net}'s {network.tokens_spatial_shape[0]} × {network.tokens_spatial_shape[1]} token grid "
                         f"does not divide into its mask units; attnviz cannot lay out its windows.")
    layouts, attentions, blocks, orders = [], [], [], {}
    key_grid, key_cells = raster_cells(network, 0)
    stage, in_stage = 0, -1
    for i, block in enumerate(network.blocks):
        if i - 1 in network.stage_ends:
            stage, in_stage = stage + 1, -1
        in_stage += 1
        attn = block.attn
        grid, cells = raster_cells(network, i)
        orders[len(cells)] = torch.argsort(cells)  # raster cell r → its position in the sequence
        nq, nk = len(cells), len(key_cells)
        w = nk // (attn.q_stride * attn.window_size) if attn.use_mask_unit_attn else 1
        if nq * attn.q_stride != nk or nk % w or (attn.use_mask_unit_attn and nq != w * attn.window_size):
            raise ModelError(f"{net}'s block {i} does not pool its {nk} tokens into windows attnviz can lay out.")
        windows = cells.reshape(-1, w).T.contiguous()  # row t of window w: position t · W + w
        keys = key_cells.reshape(-1, w).T.contiguous()
        side = math.isqrt(windows.shape[1])
        window = (side, side) if attn.use_mask_unit_attn and side * side == windows.shape[1] else grid
        pooled = grid != key_grid
        layouts.append(LayerLayout(
            stage, in_stage, grid, size // grid[0], window, (0, 0), attn.heads, attn.head_dim, float(attn.scale),
            windows, key_windows=keys if pooled else None, key_grid=key_grid if pooled else None))
        attentions.append(attn)
        blocks.append(block)
        key_grid, key_cells = grid, cells
    first = layouts[0]
    return HieraAdapter(
        family="timm Hiera", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=stride[0], embed_dim=network.blocks[0].dim,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=None,
        read_tokens=partial(raster_tokens, orders),
    )


FAMILY = register(Family("timm Hiera", adapter, recognises=recognises))
