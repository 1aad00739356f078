"""timm's EfficientFormer (Li et al. 2022): PoolFormer-style convolutional stages, then global attention
with a learned bias in the last stage's Meta3D blocks (``MetaBlock1d``).

The last stage's feature map is flattened (``Flat``: ``x.flatten(2).transpose(1, 2)``, raster order)
into one set of h · w tokens; each Meta3D block's ``Attention`` attends over all of them (one window,
W = 1) with weights

    softmax(q · kᵀ · d_k^−½ + B),  B[h, i, j] = attention_biases[h, |Δrow| · w + |Δcol|],

a learned table over the absolute row and column offsets of the 7 × 7 grid it was built for. The
attention has no fused path (timm always computes this softmax eagerly), so q and k are read at the
output of ``qkv``, laid out per head as [q (d_k) | k (d_k) | v (attn_ratio · d_k)]; B depends only on
the weights, so it is taken once at wrap time with the module's own index. The bias table is fixed to
its grid, so the model takes only the input size that gives it (224 px for every timm member).

The capture is a :class:`attnviz.Capture` with its own layouts: one layer per Meta3D block, all on the last
stage's grid (the layers are only the attention blocks; the pooling blocks before them have none).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.efficientformer import Attention, EfficientFormer, MetaBlock1d

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter
from .registry import Family, register
from .tap import Recorder, Tap


def attention_blocks(network: torch.nn.Module) -> list[tuple[int, int, torch.nn.Module]]:
    """(stage, index among that stage's attention blocks, block) of every Meta3D block, in order."""
    out = []
    for s, stage in enumerate(network.stages):
        found = [b for b in stage.blocks if isinstance(b, MetaBlock1d)]
        out += [(s, i, block) for i, block in enumerate(found)]
    return out


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not EfficientFormer:
        return False
    blocks = attention_blocks(network)
    return bool(blocks) and all(type(b) is MetaBlock1d and type(b.token_mixer) is Attention for _, _, b in blocks)


def head_part(attn: Attention, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """(1, N, H · (2 d_k + d_v)) output of ``qkv`` → its q (part 0) or k (1) as (H, 1, N, d_k), split the
    way ``Attention.forward`` splits it (per head: q, k, v)."""
    n = qkv.shape[1]
    per_head = qkv[0].reshape(n, attn.num_heads, -1).transpose(0, 1)  # (H, N, 2 d_k + d_v)
    d = attn.key_dim
    return per_head[..., part * d:(part + 1) * d][:, None]


class EfficientFormerAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        tap.after(attn.qkv, layer, Recorder.put_query, partial(head_part, attn, 0))
        tap.after(attn.qkv, layer, Recorder.put_key, partial(head_part, attn, 1))


@torch.no_grad()
def attention_bias(attn: Attention) -> torch.Tensor:
    """(1, H, N, N): the learned bias the module adds to its logits (``get_attention_biases``)."""
    return attn.attention_biases[:, attn.attention_bias_idxs][None].detach().clone()


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    stride = 2 ** (len(network.stages) + 1)  # the stem's 4, then each later stage's downsampling by 2
    found = attention_blocks(network)
    tokens = found[0][2].token_mixer.attention_bias_idxs.shape[0]
    side = round(tokens ** 0.5)
    if isinstance(size, bool) or not isinstance(size, int) or size != side * stride:
        raise ModelError(
            f"{net}'s attention bias is a learned table for a {side} × {side} token grid, so it takes only "
            f"{side * stride} px inputs, not {size!r}.")
    grid = (side, side)
    windows = torch.arange(side * side)[None]  # one window of every token, in raster order (Flat)
    layouts, biases, attentions, blocks = [], [], [], []
    for s, b, block in found:
        attn = block.token_mixer
        layouts.append(LayerLayout(s, b, grid, stride, grid, (0, 0), attn.num_heads, attn.key_dim,
                                   float(attn.scale), windows))
        biases.append(attention_bias(attn))
        attentions.append(attn)
        blocks.append(block)
    first = layouts[0]
    return EfficientFormerAdapter(
        family="timm EfficientFormer", attentions=tuple(attentions), blocks=tuple(blocks),
        num_heads=first.num_heads, head_dim=first.head_dim, scale=first.scale, patch=network.stem.stride,
        embed_dim=network.num_features, num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts),
        window_bias=tuple(biases),
    )


FAMILY = register(Family("timm EfficientFormer", adapter, recognises=recognises))
