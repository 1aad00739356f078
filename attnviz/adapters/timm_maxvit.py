"""timm's MaxViT (Tu et al. 2022, "MaxViT: Multi-Axis Vision Transformer"): block and grid attention
between MBConv blocks, in stages.

Each MaxViT block is an MBConv, then block attention, then grid attention, both on the stage's token grid
(h, w) (``MaxxVitBlock``: two attention layers here, one per partition):

- block attention (``window_partition``): windows of P × P neighbouring tokens, as in Swin without the shift;
- grid attention (``grid_partition``): a G × G grid laid over the whole image, so a "window" is the G · G
  tokens h/G rows and w/G columns apart (token (a · h/G + i, b · w/G + j) is row (a, b) of window (i, j)).

Inside each window the weights are softmax(q · kᵀ · d_k^−½ + B), B the partition's learned relative-position
bias (H, T, T): a table (``RelPosBias``, ``RelPosBiasTf``) or an MLP over log-spaced relative coordinates
(``RelPosMlp``, the ``rmlp`` members). B depends only on the weights, so it is computed once at wrap time with
the module's own ``get_bias()`` (the fused path hands the same tensor to SDPA as its mask). q and k are read at
the output of the ``qkv`` projection (a Linear for channels-last attention, a 1 × 1 convolution for
the NCHW variant), laid out per head as ``AttentionCl`` / ``Attention2d`` split it.

timm's CoAtNet members of the same module (Dai et al. 2021) have instead, after their MBConv stages,
transformer blocks (``TransformerBlock2d``, NCHW ``Attention2d``) that attend over every token of the stage's
grid with a relative-position bias built for that grid: one window of all the tokens (W = 1), the first block
of a stage on the grid its pooled input has (the stage's grid). The experimental parallel block
(``ParallelMaxxVitBlock``: block and grid attention side by side, concatenated) is refused in one sentence. The
capture is a :class:`attnviz.Capture` with its own layouts: layer l = (stage, attention layer within the stage), for
MaxViT block attention and grid attention alternating.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.maxxvit import (
    Attention2d,
    AttentionCl,
    ConvNeXtBlock,
    MaxxVit,
    MaxxVitBlock,
    MbConvBlock,
    ParallelMaxxVitBlock,
    PartitionAttention2d,
    PartitionAttentionCl,
    TransformerBlock2d,
)

from ..errors import ModelError
from ..stages import LayerLayout, window_partition_index
from .base import Adapter
from .registry import Family, register
from .tap import Recorder, Tap, channels_first, residual


UNREAD = {  # the module's other attention blocks, in words
    ParallelMaxxVitBlock: "parallel block and grid attention whose outputs are concatenated",
}


def recognises(network: torch.nn.Module) -> bool:
    return type(network) is MaxxVit


def grid_partition_index(grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """(W, T): the raster index of each window row of MaxViT's grid partition (``grid_partition``): a
    ``size`` = (G_h, G_w) grid over the (h, w) tokens; window (i, j), row (a, b) is token
    (a · h/G_h + i, b · w/G_w + j); windows and rows in row-major order."""
    (h, w), (gh, gw) = grid, size
    index = torch.arange(h * w).reshape(gh, h // gh, gw, w // gw)
    return index.permute(1, 3, 0, 2).reshape(-1, gh * gw)


def split_cl(heads: int, head_first: bool, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """``AttentionCl``'s qkv output (W, wh, ww, 3 · H · d_k) of the one image → its q (part 0) or k (1): (H, W, T, d_k)."""
    w = qkv.shape[0]
    if head_first:  # per head: q, k, v of d_k channels each
        return qkv.reshape(w, -1, heads, 3, qkv.shape[-1] // heads // 3)[:, :, :, part].permute(2, 0, 1, 3)
    return qkv.reshape(w, -1, 3, heads, qkv.shape[-1] // heads // 3)[:, :, part].permute(2, 0, 1, 3)


def split_2d(heads: int, head_first: bool, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """``Attention2d``'s qkv output (W, 3 · H · d_k, wh, ww) → q (part 0) or k (1): (H, W, T, d_k)."""
    w = qkv.shape[0]
    if head_first:
        return qkv.reshape(w, heads, 3, qkv.shape[1] // heads // 3, -1)[:, :, part].permute(1, 0, 3, 2)
    return qkv.reshape(w, 3, heads, qkv.shape[1] // heads // 3, -1)[:, part].permute(1, 0, 3, 2)


class MaxVitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        split = split_cl if type(attn) is AttentionCl else split_2d
        tap.after(attn.qkv, layer, Recorder.put_query, partial(split, attn.num_heads, attn.head_first, 0))
        tap.after(attn.qkv, layer, Recorder.put_key, partial(split, attn.num_heads, attn.head_first, 1))


def feature_grids(network: MaxxVit, size: int) -> list[tuple[int, int]]:
    """Each stage's token grid at S × S inputs, as ``MaxxVit.set_input_size`` computes it."""
    stride = network.stem.stride
    side = size // (stride if isinstance(stride, int) else stride[0])
    grids = []
    for _ in network.stages:
        side = (side - 1) // 2 + 1
        grids.append((side, side))
    return grids


def layout(stage: int, index: int, grid: tuple[int, int], size: int, window: tuple[int, int],
           attn: torch.nn.Module, windows: torch.Tensor) -> LayerLayout:
    return LayerLayout(stage, index, grid, size // grid[0], window, (0, 0), attn.num_heads, attn.dim_head,
                       float(attn.scale), windows)


def position_bias(attn: torch.nn.Module, tokens: int) -> torch.Tensor | None:
    """(1, H, T, T): the relative-position bias the module adds to every window's logits (its SDPA mask), or None."""
    if attn.rel_pos is None:
        return None
    return attn.rel_pos.get_bias().reshape(1, attn.num_heads, tokens, tokens).detach()


@torch.no_grad()
def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ModelError(f"The input size must be a positive whole number of pixels, not {size!r}.")
    reduction = 2 * 2 ** len(network.stages)  # the stem halves the image, then every stage
    if size % reduction:
        raise ModelError(f"The input size must be a multiple of {net}'s {reduction} px total stride; {size} px is not.")
    other = next((type(b) for s in network.stages for b in s.blocks
                  if type(b) not in (MaxxVitBlock, TransformerBlock2d, MbConvBlock, ConvNeXtBlock)), None)
    if other is not None:
        what = UNREAD.get(other, f"{other.__name__} blocks")
        raise ModelError(f"This {net} has {what}, which attnviz cannot reproduce exactly yet, so it refuses it "
                         "rather than show attention weights that may be wrong.")
    layouts, biases, attentions, blocks = [], [], [], []
    for s, (stage, grid) in enumerate(zip(network.stages, feature_grids(network, size))):
        index = 0
        for block in stage.blocks:
            if type(block) is TransformerBlock2d:  # CoAtNet: one window of every token of the stage's grid
                attn = block.attn
                if type(attn) is not Attention2d:
                    raise ModelError(f"{net} has an attention layer attnviz does not know ({type(attn).__name__}), "
                                     "so it refuses it rather than show attention weights that may be wrong.")
                built = getattr(attn.rel_pos, "window_size", grid)
                if tuple(built) != grid:
                    raise ModelError(
                        f"{net}'s transformer blocks in stage {s + 1} have a position bias for a {built[0]} × "
                        f"{built[1]} token grid, not the {grid[0]} × {grid[1]} grid of {size} px inputs; build it "
                        f"with img_size={size}.")
                windows = torch.arange(grid[0] * grid[1])[None]  # (1, N)
                layouts.append(layout(s, index, grid, size, grid, attn, windows))
                biases.append(position_bias(attn, windows.shape[1]))
                attentions.append(attn)
                blocks.append(block)
                index += 1
                continue
            if type(block) is not MaxxVitBlock:
                continue
            for part in (block.attn_block, block.attn_grid):
                if part is None:
                    continue
                if type(part) not in (PartitionAttentionCl, PartitionAttention2d) or \
                        type(part.attn) not in (AttentionCl, Attention2d):
                    raise ModelError(f"{net} has an attention layer attnviz does not know ({type(part.attn).__name__}), "
                                     "so it refuses it rather than show attention weights that may be wrong.")
                window = tuple(part.partition_size)
                kind = "block" if part.partition_block else "grid"
                if grid[0] % window[0] or grid[1] % window[1]:
                    raise ModelError(
                        f"At {size} px, stage {s + 1} of {net} has a {grid[0]} × {grid[1]} token grid that does not "
                        f"divide into its {window[0]} × {window[1]} {kind} partition, which the model cannot run; use "
                        "a size where every stage divides.")
                attn = part.attn
                if part.partition_block:
                    windows = window_partition_index(grid, window, (0, 0))
                else:
                    windows = grid_partition_index(grid, window)
                layouts.append(layout(s, index, grid, size, window, attn, windows))
                biases.append(position_bias(attn, windows.shape[1]))
                attentions.append(attn)
                blocks.append(part)
                index += 1
    if not layouts:
        raise ModelError(f"{net} has no attention layers (only convolution blocks), so there are no attention "
                         "weights to show.")
    nchw = {type(a) is Attention2d for a in attentions}
    if len(nchw) > 1:
        raise ModelError(f"{net} mixes channels-first and channels-last attention blocks, which attnviz cannot "
                         "read as one model.")
    first = layouts[0]
    return MaxVitAdapter(
        family="timm MaxViT / CoAtNet", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=first.patch,
        embed_dim=attentions[0].qkv.weight.shape[1], num_prefix_tokens=0, has_class_token=False,
        layouts=tuple(layouts), window_bias=tuple(biases),
        read_tokens=channels_first if nchw == {True} else residual,
    )


FAMILY = register(Family("timm MaxViT / CoAtNet", adapter, recognises=recognises))
