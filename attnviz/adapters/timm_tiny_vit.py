"""timm's TinyViT (Wu et al. 2022): a convolutional stage, then stages of windowed attention with a learned bias.

The first stage is MBConv blocks (no attention); every later stage merges 2 × 2 tokens and attends
inside non-overlapping windows of T = ws² tokens of its grid (no shift; a stage whose grid is exactly
one window attends over the whole grid). Inside window w the weights are

    softmax(q · kᵀ · d_k^−½ + B),

B (H, T, T) a learned bias per head indexed by the |Δrow|, |Δcol| offset of two tokens in the window
(LeViT's attention bias), the same in every window; it is computed once at wrap time from the module's
own table. q and k are read at the output of the attention's ``qkv`` projection (after its LayerNorm),
whose rows are per head [q (d_k), k (d_k), v (d_v)]; timm's fused SDPA uses the same q, k and bias.

A grid that does not divide into windows is padded by the model with zero tokens that are not in the
photo; attnviz refuses such a size. Layer l = (stage, block), the stages counted from the first one
with attention (stage 0); each stage's grid is its own.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.tiny_vit import Attention, ConvLayer, TinyVit, TinyVitStage

from ..errors import ModelError
from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_windows
from .registry import Family, register
from .tap import Recorder, Tap

STRIDE = 4  # the patch embedding's two stride-2 convolutions


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not TinyVit:
        return False
    stages = list(network.stages)
    attention = [s for s in stages if type(s) is TinyVitStage]
    return bool(attention) and all(type(s) in (ConvLayer, TinyVitStage) for s in stages) and all(
        type(b.attn) is Attention for s in attention for b in s.blocks)


def window_part(attn: Attention, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """(W, T, H · (2 d_k + d_v)) output of ``attn.qkv`` for the one image's windows → q (part 0) or
    k (part 1): (H, W, T, d_k), split as ``Attention.forward`` splits it."""
    w, t, _ = qkv.shape
    d = attn.key_dim
    return qkv.view(w, t, attn.num_heads, -1)[..., part * d:(part + 1) * d].permute(2, 0, 1, 3)


@torch.no_grad()
def attention_bias(attn: Attention) -> torch.Tensor:
    """(1, H, T, T): the learned bias the module adds to every window's logits."""
    return attn.attention_biases[:, attn.attention_bias_idxs][None].detach().clone()


class TinyVitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        tap.after(attn.qkv, layer, Recorder.put_query, partial(window_part, attn, 0))
        tap.after(attn.qkv, layer, Recorder.put_key, partial(window_part, attn, 1))


def down(side: int) -> int:
    """A 3 × 3, stride-2, padding-1 convolution's output side."""
    return (side - 1) // 2 + 1


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ModelError(f"The input size must be a positive whole number of pixels, not {size!r}.")
    stride = STRIDE * 2 ** (len(network.stages) - 1)
    if size % stride:
        raise ModelError(f"The input size must be a multiple of {net}'s {stride} px token size at its last stage; "
                         f"{size} px is not.")
    side = down(down(size))  # after the patch embedding
    layouts, biases, attentions, blocks = [], [], [], []
    for s, stage in enumerate(network.stages):
        if type(stage) is ConvLayer:
            continue
        side = down(side)  # PatchMerging's stride-2 convolution
        stage_index = len({lay.stage for lay in layouts})
        for b, block in enumerate(stage.blocks):
            ws = block.window_size
            check_windows(net, size, f"stage {s + 1}", (side, side), (ws, ws))
            attn = block.attn
            grid, window = (side, side), (ws, ws)
            windows = window_partition_index(grid, window, (0, 0))  # (W, T)
            layouts.append(LayerLayout(stage_index, b, grid, size // side, window, (0, 0), attn.num_heads,
                                       attn.key_dim, float(attn.scale), windows))
            biases.append(attention_bias(attn))
            attentions.append(attn)
            blocks.append(block)
    if not layouts:
        raise ModelError(f"{net} has no attention stage, so there are no attention weights to show.")
    first = layouts[0]
    return TinyVitAdapter(
        family="timm TinyViT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=first.patch, embed_dim=attentions[0].qkv.in_features,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=tuple(biases),
    )


FAMILY = register(Family("timm TinyViT", adapter, recognises=recognises))
