"""timm's Next-ViT (Li et al. 2022, "Next-ViT: Next Generation Vision Transformer for Efficient
Deployment in Realistic Industrial Scenarios"): convolution blocks (NCB) with a transformer block
(NTB) among them in the last three stages.

An NTB's efficient multi-head self-attention (E-MHSA, ``EfficientAttention``) lets every token of the
stage's h × w grid attend to keys from a reduced sequence: the tokens in raster order are averaged in
runs of R² consecutive tokens (``AvgPool1d`` of kernel and stride R², R the stage's ``sr_ratio``), then a
BatchNorm, and ``k`` projects those. The weights are softmax(q · kᵀ · d_k^−½), with q read at the output
of ``q`` and k at the output of ``k``: the tensors SDPA is given.

The runs are of the raster sequence, not of R × R squares. With g = gcd(R², w) every R² / g token rows
hold w / g whole runs, so the keys are laid on a (h · g / R²) × (w / g) grid: key row a is exactly the
token rows a · R² / g … (a + 1) · R² / g − 1, and inside it the keys follow raster order. Where R² divides
w (g = R²) each key is a 1 × R² strip of one token row, and the grid is exact; otherwise a key's run
wraps onto the next token row of its band, and its column on the key grid is only where its run starts
and ends in raster order (at 224 px: 16-token runs of a 28-wide grid, 4-token runs of a 14-wide grid).

The capture is a :class:`attnviz.Capture` with its own layouts: one layer per NTB, (stage, block) its place
among all the stage's blocks; the convolution blocks have no attention and are not layers.
"""
from __future__ import annotations

import math
from functools import partial

import torch
from timm.models.nextvit import EfficientAttention, NextTransformerBlock, NextViT

from ..errors import ModelError
from .base import Adapter
from .registry import Family, register
from .tap import Recorder, Tap, channels_first
from .timm_pvt_v2 import check_stride, global_layout, heads_of


def transformer_blocks(network: torch.nn.Module) -> list[torch.nn.Module]:
    return [block for stage in network.stages for block in stage.blocks if isinstance(block, NextTransformerBlock)]


def recognises(network: torch.nn.Module) -> bool:
    blocks = transformer_blocks(network) if type(network) is NextViT else []
    return bool(blocks) and all(
        type(block) is NextTransformerBlock and type(block.e_mhsa) is EfficientAttention for block in blocks)


def run_grid(net: str, size: int, stage: int, grid: tuple[int, int], run: int) -> tuple[int, int]:
    """The grid of the keys made by averaging ``run`` consecutive raster tokens of ``grid`` (module docstring)."""
    h, w = grid
    if (h * w) % run:
        raise ModelError(
            f"At {size} px, stage {stage + 1} of {net} has a {h} × {w} token grid whose {h * w} tokens do not "
            f"divide into the runs of {run} its spatial reduction averages, so its keys leave out the last "
            "tokens of the photo; attnviz refuses that size rather than show keys for only part of it.")
    g = math.gcd(run, w)
    return h * g // run, w // g


class NextViTAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        heads = attn.num_heads
        tap.after(attn.q, layer, Recorder.put_query, partial(heads_of, heads, 1, 0))
        tap.after(attn.k, layer, Recorder.put_key, partial(heads_of, heads, 1, 0))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    check_stride(net, 32, size)  # a stride-4 stem, then stages of stride 1, 2, 2, 2
    side = size // 4
    layouts, attentions, blocks = [], [], []
    for s, stage in enumerate(network.stages):
        for b, block in enumerate(stage.blocks):
            if isinstance(block.patch_embed.pool, torch.nn.AvgPool2d):  # stride 2 (ceil: exact, size divides)
                side //= 2
            if not isinstance(block, NextTransformerBlock):
                continue
            grid, attn = (side, side), block.e_mhsa
            key_grid = None if attn.sr is None else run_grid(net, size, s, grid, attn.N_ratio)
            layouts.append(global_layout(s, b, grid, size // side, attn.num_heads, attn.head_dim,
                                         float(attn.scale), key_grid))
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return NextViTAdapter(
        family="timm Next-ViT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=first.patch, embed_dim=attentions[0].dim,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), read_tokens=channels_first,
    )


FAMILY = register(Family("timm Next-ViT", adapter, recognises=recognises))
