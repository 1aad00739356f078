"""timm's Visformer (Chen et al. 2021, "Visformer: The Vision-friendly Transformer"): a convolutional
stem and stage, then attention on the convolutional feature maps of two stages.

Each attention block (``Block`` with an ``attn``) attends over every cell of its stage's (h, w) feature
map (one window, W = 1); its ``Attention`` projects with a 1 × 1 convolution ``qkv`` whose output
(1, 3 · H · d_k, h, w) is read as q, k, v (3, H, d_k, h · w), tokens in the raster order of
``flatten`` over (h, w), and computes softmax(q · kᵀ · d_k^−½) (fused: SDPA with its default scale).
So q and k are read at the output of ``qkv``. Blocks whose ``attn`` is disabled (the first stage of
every timm member) have no attention and are not layers. The blocks' outputs are (1, C, h, w), read
channels first. The position embeddings are fixed to the built size, so the model takes only that size.

The capture is a :class:`attnviz.Capture` with its own layouts: one layer per attention block, at its stage's grid.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.visformer import Attention, Block, Visformer

from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap, channels_first


def stages(network: torch.nn.Module) -> list[tuple[torch.nn.Module | None, torch.nn.Module]]:
    """(patch embedding or None, blocks) of each of the three stages."""
    return [(network.patch_embed1, network.stage1), (network.patch_embed2, network.stage2),
            (network.patch_embed3, network.stage3)]


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not Visformer:
        return False
    blocks = [b for _, stage in stages(network) for b in stage]
    attentions = [b.attn for b in blocks if b.attn is not None]
    return bool(attentions) and all(type(b) is Block for b in blocks) and all(type(a) is Attention for a in attentions)


def conv_part(attn: Attention, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """(1, 3 · H · d_k, h, w) output of ``qkv`` → its q (part 0) or k (1) as (H, 1, h · w, d_k), read the way
    ``Attention.forward`` reads it: reshape (3, H, d_k, N), then tokens before channels."""
    return qkv[0].reshape(3, attn.num_heads, attn.head_dim, -1)[part].transpose(-2, -1)[:, None]


class VisformerAdapter(Adapter):
    def heads_meet(self, layer: int) -> tuple[torch.nn.Module, int]:
        return self.attentions[layer].proj, 1  # a 1 × 1 conv on (1, H · d, h, w): head-major channels

    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        tap.after(attn.qkv, layer, Recorder.put_query, partial(conv_part, attn, 0))
        tap.after(attn.qkv, layer, Recorder.put_key, partial(conv_part, attn, 1))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    first = network.patch_embed1
    stem = 1 if network.stem is None else 2  # the convolutional stem halves the photo before patch_embed1
    patch = stem * first.patch_size[0]
    check_square_size(net, patch, size, tuple(network.img_size), dynamic=False)
    grid = tuple(first.grid_size)
    layouts, attentions, blocks = [], [], []
    for s, (embed, stage) in enumerate(stages(network)):
        if embed is not None and s:
            grid = tuple(embed.grid_size)  # each later stage's patch embedding halves the grid
        found = [block for block in stage if block.attn is not None]
        windows = torch.arange(grid[0] * grid[1])[None]  # one window of every cell, in raster order
        for b, block in enumerate(found):
            attn = block.attn
            layouts.append(LayerLayout(s, b, grid, size // grid[0], grid, (0, 0), attn.num_heads, attn.head_dim,
                                       float(attn.scale), windows))
            attentions.append(attn)
            blocks.append(block)
    one = layouts[0]
    return VisformerAdapter(
        family="timm Visformer", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=one.num_heads,
        head_dim=one.head_dim, scale=one.scale, patch=patch, embed_dim=network.embed_dim, num_prefix_tokens=0,
        has_class_token=False, layouts=tuple(layouts), read_tokens=channels_first,
    )


FAMILY = register(Family("timm Visformer", adapter, recognises=recognises))
