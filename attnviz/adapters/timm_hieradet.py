"""timm's HieraDet, SAM 2's Hiera image encoder (Ravi et al. 2024, "SAM 2"): windowed and global attention
in stages, queries max-pooled at each stage transition.

Unlike the original Hiera, HieraDet keeps its tokens on an (h, w) grid. A windowed ``MultiScaleBlock``
cuts the grid into ws × ws windows (``window_partition``: windows in row-major order, tokens in raster
order inside each), a global one (``global_att_blocks``) attends over the whole grid. The first block of
a pooled stage keeps the previous stage's window size on the previous stage's grid and max-pools the
queries of each window (``MultiScaleAttention.q_pool``, a 2 × 2 ``MaxPool2d``): its keys are the ws × ws
tokens of a window of the key grid, its queries the (ws / 2)² tokens of that window on the pooled grid,
which ``window_unpartition`` puts back there.

The weights are softmax(q · kᵀ · d_k^−½), no bias. k (and q where nothing is pooled) are read at the
output of the ``qkv`` projection, the pooled q at the output of the attention's own ``q_pool``; the fused
SDPA path uses the same q and k. A layer's ``key_windows`` are the raster cells of an arange key grid cut
by the model's own ``window_partition``, its ``windows`` those of the pooled grid that the model's own
``window_unpartition`` gives each (window, row) of its output.

Sizes: the model pads a grid that does not divide into its windows with tokens that are not in the
photo; attnviz refuses such a size in one sentence (SAM 2's 1024 px does: a 64 × 64 stage in 14 × 14
windows). ``sam2_hiera_tiny`` and ``_small`` at their 896 px, and at 224 px, divide at every stage.

The capture is a :class:`attnviz.Capture` with its own layouts: layer l = (stage, block), the stage that the block
belongs to in timm's ``stages`` (the first block of a stage is the pooling one).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.hieradet_sam2 import (
    HieraDet,
    HieraPatchEmbed,
    MultiScaleAttention,
    MultiScaleBlock,
    window_partition,
    window_unpartition,
)

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size, check_windows
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    return (type(network) is HieraDet and bool(len(network.blocks))
            and all(type(b) is MultiScaleBlock and type(b.attn) is MultiScaleAttention for b in network.blocks))


def qkv_part(heads: int, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """The ``qkv`` output (W, h, w, 3 · H · d) of the windows → q (part 0) or k (1): (H, W, h · w, d)."""
    windows, h, w, _ = qkv.shape
    return qkv.reshape(windows, h * w, 3, heads, -1)[:, :, part].permute(2, 0, 1, 3)


def pooled_query(heads: int, q: torch.Tensor) -> torch.Tensor:
    """The ``q_pool`` output (W, H · d, h, w) → the pooled q (H, W, h · w, d), as ``forward`` reshapes it."""
    windows, _, h, w = q.shape
    return q.permute(0, 2, 3, 1).reshape(windows, h * w, heads, -1).permute(2, 0, 1, 3)


class HieraDetAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn, heads = self.attentions[layer], self.layouts[layer].num_heads
        if attn.q_pool is None:
            tap.after(attn.qkv, layer, Recorder.put_query, partial(qkv_part, heads, 0))
        else:
            tap.after(attn.q_pool, layer, Recorder.put_query, partial(pooled_query, heads))
        tap.after(attn.qkv, layer, Recorder.put_key, partial(qkv_part, heads, 1))


def arange_grid(grid: tuple[int, int]) -> torch.Tensor:
    """(1, h, w, 1): every cell holds its raster index."""
    return torch.arange(grid[0] * grid[1], dtype=torch.float64).reshape(1, *grid, 1)


@torch.no_grad()
def key_cells(grid: tuple[int, int], window: tuple[int, int] | None) -> torch.Tensor:
    """(W, T): the raster cell of every window's tokens, as the model's ``window_partition`` cuts the grid."""
    if window is None:
        return torch.arange(grid[0] * grid[1])[None]
    return window_partition(arange_grid(grid), window).reshape(-1, window[0] * window[1]).long()


@torch.no_grad()
def query_cells(grid: tuple[int, int], window: tuple[int, int] | None) -> torch.Tensor:
    """(W, T): the raster cell where the model's ``window_unpartition`` puts row t of window w's output."""
    n = grid[0] * grid[1]
    if window is None:
        return torch.arange(n)[None]
    rows = torch.arange(n, dtype=torch.float64).reshape(-1, *window, 1)  # (W, wh, ww, 1): w · T + t
    placed = window_unpartition(rows, window, grid).reshape(-1).long()  # raster cell r holds w · T + t
    cells = torch.empty(n, dtype=torch.long)
    cells[placed] = torch.arange(n)
    return cells.reshape(-1, window[0] * window[1])


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    embed = network.patch_embed
    if type(embed) is HieraPatchEmbed:
        conv = embed.proj
        stride = conv.stride[0]
        check_square_size(net, stride, size, None, dynamic=False)
        side = (size + 2 * conv.padding[0] - conv.kernel_size[0]) // stride + 1
    else:
        stride = embed.patch_size[0]
        check_square_size(net, stride, size, None, dynamic=False)
        side = size // stride
    tile = network.pos_embed_window.shape[-1]
    if side % tile:
        raise ModelError(f"At {size} px {net} has a {side} × {side} token grid, which its {tile} × {tile} window "
                         f"position embedding does not tile; use a multiple of {stride * tile} px.")
    grid = (side, side)
    layouts, attentions, blocks = [], [], []
    stage, in_stage = 0, -1
    for i, block in enumerate(network.blocks):
        if i - 1 in network.stage_ends:
            stage, in_stage = stage + 1, -1
        in_stage += 1
        attn = block.attn
        window = tuple(block.window_size) if block.is_windowed else None
        if window is not None:
            check_windows(net, size, f"block {i + 1}", grid, window)
        queries, q_window = grid, window
        if block.q_stride is not None:
            st = tuple(block.q_stride)
            if grid[0] % st[0] or grid[1] % st[1] or (window is not None and (window[0] % st[0] or window[1] % st[1])):
                raise ModelError(f"At {size} px, block {i + 1} of {net} max-pools a {grid[0]} × {grid[1]} token grid "
                                 f"that does not divide by {st[0]} × {st[1]}; use a size where every stage divides.")
            queries = (grid[0] // st[0], grid[1] // st[1])
            q_window = None if window is None else (window[0] // st[0], window[1] // st[1])
        heads = attn.num_heads
        head_dim = attn.dim_out // heads
        windows = query_cells(queries, q_window)
        pooled = queries != grid
        layouts.append(LayerLayout(
            stage, in_stage, queries, size // queries[0], q_window or queries, (0, 0), heads, head_dim,
            float(attn.scale), windows, key_windows=key_cells(grid, window) if pooled else None,
            key_grid=grid if pooled else None))
        attentions.append(attn)
        blocks.append(block)
        grid = queries
    first = layouts[0]
    return HieraDetAdapter(
        family="timm HieraDet", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=stride, embed_dim=network.blocks[0].dim,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=None,
    )


FAMILY = register(Family("timm HieraDet", adapter, recognises=recognises))
