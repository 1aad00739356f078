"""timm's LeViT (Graham et al. 2021, "LeViT: a Vision Transformer in ConvNet's Clothing"): attention with
a learned bias, in stages whose first layer sub-samples the queries.

Every attention layer computes softmax(q · kᵀ · d_k^−½ + B), B a learned table indexed by the absolute
offset |Δrow|, |Δcolumn| between a query's and a key's cell (``attention_biases[:, attention_bias_idxs]``),
over all the tokens of its stage (global attention: one window). A stage after the first opens with an
``AttentionDownsample``: its keys are every cell of the previous stage's grid, its queries only every
other cell of every other row (``x[:, ::2, ::2]`` for the linear models, ``AvgPool2d(1, 2)`` for the
convolutional ``levit_conv_*``), so the layer's grid is the queries' (the next stage's) and its
``key_grid`` the full one; a 7 × 7 grid gives 4 × 4 queries at cells 0, 2, 4, 6.

LeViT has no fused path: q and k are read at the output of the modules that make them (``qkv``, or
``q`` and ``kv``), each head's q, k (and v) side by side in one projection. The bias depends only on the
weights and the grid, so it is taken once at wrap time, with the module's own index buffer.

The capture is a :class:`attnviz.Capture` with its own layouts: layer l = (stage, block), the stage as timm
numbers it (0-based), the block counted among the stage's attention layers (a downsampling stage's
``AttentionDownsample`` is its block 0).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.levit import Attention, AttentionDownsample, Levit, LevitDistilled, Stem8, Stem16

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap, channels_first, residual

NETWORKS = (Levit, LevitDistilled)


def attention_layers(network: torch.nn.Module) -> list[tuple[int, torch.nn.Module, torch.nn.Module]]:
    """(stage, attention, block whose output is the residual stream after it), in the order they run."""
    out = []
    for s, stage in enumerate(network.stages):
        down = getattr(stage.downsample, "attn_downsample", None)
        if down is not None:
            out.append((s, down, stage.downsample))
        out.extend((s, block.attn, block) for block in stage.blocks)
    return out


def recognises(network: torch.nn.Module) -> bool:
    if type(network) not in NETWORKS or type(network.stem) not in (Stem8, Stem16):
        return False
    layers = attention_layers(network)
    return bool(layers) and all(type(a) in (Attention, AttentionDownsample) for _, a, _ in layers)


def head_part(heads: int, start: int, width: int, conv: bool, out: torch.Tensor) -> torch.Tensor:
    """A projection's (1, N, H · c) output (linear) or (1, H · c, h, w) (conv), each head's c channels
    side by side → channels ``start : start + width`` of every head: (H, 1, N, width)."""
    if conv:
        x = out[0].reshape(heads, -1, out.shape[-2] * out.shape[-1])[:, start : start + width]  # (H, width, N)
        return x.transpose(1, 2)[:, None]
    x = out[0].reshape(out.shape[1], heads, -1)[..., start : start + width]  # (N, H, width)
    return x.permute(1, 0, 2)[:, None]


class LevitAdapter(Adapter):
    def heads_meet(self, layer: int) -> tuple[torch.nn.Module, int]:
        attn = self.attentions[layer]  # proj = (Hardswish, Linear or 1 × 1 conv + BN): heads side by side go in
        return attn.proj, 1 if attn.use_conv else -1

    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        heads, kd, conv = attn.num_heads, attn.key_dim, attn.use_conv
        if type(attn) is Attention:  # qkv: per head [q (d_k), k (d_k), v]
            tap.after(attn.qkv, layer, Recorder.put_query, partial(head_part, heads, 0, kd, conv))
            tap.after(attn.qkv, layer, Recorder.put_key, partial(head_part, heads, kd, kd, conv))
        else:  # q on the sub-sampled cells: per head [q]; kv on every cell: per head [k (d_k), v]
            tap.after(attn.q, layer, Recorder.put_query, partial(head_part, heads, 0, kd, conv))
            tap.after(attn.kv, layer, Recorder.put_key, partial(head_part, heads, 0, kd, conv))


def query_grid(grid: tuple[int, int], stride: int) -> tuple[int, int]:
    """The cells ``x[::stride, ::stride]`` (or ``AvgPool2d(1, stride)``) keeps of ``grid``."""
    return (-(-grid[0] // stride), -(-grid[1] // stride))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    stride = network.stem.stride
    layers = attention_layers(network)
    first = tuple(layers[0][1].resolution)
    check_square_size(net, stride, size, None, dynamic=False)
    if first != (size // stride, size // stride):
        raise ModelError(f"{net} was built for {first[0] * stride} × {first[1] * stride} px inputs, not {size} px "
                         f"(its attention biases are tables for a {first[0]} × {first[1]} token grid); build it "
                         f"with img_size={size}.")
    layouts, biases, attentions, blocks = [], [], [], []
    grid = (size // stride, size // stride)
    counts: dict[int, int] = {}
    for s, attn, block in layers:
        keys = tuple(attn.resolution)
        if keys != grid:
            raise ModelError(f"{net} expects a {keys[0]} × {keys[1]} token grid at stage {s + 1}, not the "
                             f"{grid[0]} × {grid[1]} of a {size} px input; build it with img_size={size}.")
        queries = query_grid(keys, attn.stride) if type(attn) is AttentionDownsample else keys
        b = counts[s] = counts.get(s, -1) + 1
        nq, nk = queries[0] * queries[1], keys[0] * keys[1]
        layouts.append(LayerLayout(
            s, b, queries, size // queries[0], queries, (0, 0), attn.num_heads, attn.key_dim, float(attn.scale),
            torch.arange(nq)[None], key_windows=None if queries == keys else torch.arange(nk)[None],
            key_grid=None if queries == keys else keys))
        with torch.no_grad():
            biases.append(attn.attention_biases[:, attn.attention_bias_idxs].detach()[None])  # (1, H, Nq, Nk)
        attentions.append(attn)
        blocks.append(block)
        grid = queries
    lay = layouts[0]
    return LevitAdapter(
        family="timm LeViT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=lay.num_heads,
        head_dim=lay.head_dim, scale=lay.scale, patch=stride, embed_dim=network.embed_dim[0],
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=tuple(biases),
        read_tokens=channels_first if network.use_conv else residual,
    )


FAMILY = register(Family("timm LeViT", adapter, recognises=recognises))
