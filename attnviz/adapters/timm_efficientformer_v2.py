"""timm's EfficientFormer V2 (Li et al. 2022, "Rethinking Vision Transformers for MobileNet Size and
Speed"): talking-heads attention with a learned bias, in the last two of four convolutional stages.

Its ``Attention2d`` (the last ``num_vit`` blocks of stages 3 and 4) computes

    A = softmax(T₁(q · kᵀ · d_k^−½ + B)),   then mixes the heads again: T₂(A) @ v,

B a learned table indexed by the absolute offset between a query's and a key's cell
(``attention_biases[:, attention_bias_idxs]``), T₁ and T₂ 1 × 1 convolutions across the heads
(``talking_head1``, ``talking_head2``: an (H, H) matrix and a per-head constant). The weights attnviz
shows are A, the softmax: T₂ mixes the heads' rows after it, which changes what reaches v but not the
softmax. T₁(s + B) = M s + (M B + b) with M = T₁'s (H, H) weight, so the layer's ``window_mix`` is M
and its bias M B + b (b, constant along a row, leaves the softmax as it is; it is kept so the logits
are the model's). In stage 3 the attention runs on the grid of a stride-2 depthwise convolution
(``stride_conv``), then upsamples: its grid is that strided grid, half the stage's.

Stage 4 opens with ``Attention2dDownsample``: keys on every cell of stage 3's grid, queries from a
stride-2 convolution plus a stride-2 ``AvgPool2d(1)`` (``LocalGlobalQuery``), on cells 0, 2, 4, … of
each axis; it has no talking heads. Its layout's grid is the queries' (stage 4's) and ``key_grid``
the full one.

q and k are the outputs of the ``q`` and ``k`` modules (1 × 1 convolutions with a BatchNorm, NCHW),
each head's ``key_dim`` channels side by side; the bias and the mix depend only on the weights and
are computed once at wrap time. The capture is a :class:`attnviz.Capture` with its own layouts: layer l =
(stage, block), the stage as timm numbers it (0-based: 2 and 3), the block counted among the stage's
attention layers (stage 4's ``Attention2dDownsample`` is its block 0).
"""
from __future__ import annotations

import math
from functools import partial

import torch
from timm.models.efficientformer_v2 import Attention2d, Attention2dDownsample, EfficientFormerV2

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter
from .registry import Family, register
from .tap import Recorder, Tap, channels_first

STRIDE = 32  # the stem's 4, then three stride-2 stages


def attention_layers(network: torch.nn.Module) -> list[tuple[int, torch.nn.Module, torch.nn.Module]]:
    """(stage, attention, block whose output is the residual stream after it), in the order they run."""
    out = []
    for s, stage in enumerate(network.stages):
        down = getattr(stage.downsample, "attn", None)
        if down is not None:
            out.append((s, down, stage.downsample))
        out.extend((s, block.token_mixer, block) for block in stage.blocks if block.token_mixer is not None)
    return out


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not EfficientFormerV2:
        return False
    layers = attention_layers(network)  # none when built with num_vit=0: refused in adapter()
    return all(type(a) in (Attention2d, Attention2dDownsample) for _, a, _ in layers)


def heads_of(heads: int, out: torch.Tensor) -> torch.Tensor:
    """A q or k projection's (1, H · d_k, h, w) output → (H, 1, h · w, d_k), as the model reshapes it."""
    return out[0].reshape(heads, -1, out.shape[-2] * out.shape[-1]).transpose(1, 2)[:, None]


class EfficientFormerV2Adapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        tap.after(attn.q, layer, Recorder.put_query, partial(heads_of, attn.num_heads))
        tap.after(attn.k, layer, Recorder.put_key, partial(heads_of, attn.num_heads))


def half(grid: tuple[int, int]) -> tuple[int, int]:
    """The grid of a stride-2, 3 × 3 convolution with padding 1 (or of cells 0, 2, 4, …)."""
    return (math.ceil(grid[0] / 2), math.ceil(grid[1] / 2))


@torch.no_grad()
def logit_bias(attn: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(1, H, Nq, Nk) bias added after the heads' mix, and the (H, H) mix (None without talking heads)."""
    bias = attn.attention_biases[:, attn.attention_bias_idxs]  # (H, Nq, Nk)
    talk = getattr(attn, "talking_head1", None)
    if talk is None:
        return bias[None].detach(), None
    mix = talk.weight[:, :, 0, 0]  # (H, H)
    bias = torch.einsum("hg,gqk->hqk", mix, bias)
    if talk.bias is not None:
        bias = bias + talk.bias[:, None, None]
    return bias[None].detach(), mix.detach().clone()


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ModelError(f"The input size must be a positive whole number of pixels, not {size!r}.")
    if size % STRIDE:
        raise ModelError(f"attnviz reads {net} at sizes that are a multiple of {STRIDE} px, where every stage's "
                         f"tokens are whole squares of the photo; {size} px is not.")
    layouts, biases, mixes, attentions, blocks = [], [], [], [], []
    counts: dict[int, int] = {}
    for s, attn, block in attention_layers(network):
        side = size // 2 ** (s + 2)  # stage s's token grid
        if type(attn) is Attention2dDownsample:
            keys, queries, expected = tuple(attn.resolution), tuple(attn.resolution2), (2 * side, 2 * side)
        else:
            keys = queries = tuple(attn.resolution)
            expected = half((side, side)) if attn.stride_conv is not None else (side, side)
        if keys != expected:
            raise ModelError(f"{net} was built for another input size than {size} px (its attention in stage "
                             f"{s + 1} is on a {keys[0]} × {keys[1]} grid, not {expected[0]} × {expected[1]}); "
                             f"build it with img_size={size}.")
        b = counts[s] = counts.get(s, -1) + 1
        nq, nk = queries[0] * queries[1], keys[0] * keys[1]
        layouts.append(LayerLayout(
            s, b, queries, size // queries[0], queries, (0, 0), attn.num_heads, attn.key_dim, float(attn.scale),
            torch.arange(nq)[None], key_windows=None if queries == keys else torch.arange(nk)[None],
            key_grid=None if queries == keys else keys))
        bias, mix = logit_bias(attn)
        biases.append(bias)
        mixes.append(mix)
        attentions.append(attn)
        blocks.append(block)
    if not layouts:
        raise ModelError(f"{net} was built without attention layers, so there are no attention weights to show.")
    lay = layouts[0]
    return EfficientFormerV2Adapter(
        family="timm EfficientFormer V2", attentions=tuple(attentions), blocks=tuple(blocks),
        num_heads=lay.num_heads, head_dim=lay.head_dim, scale=lay.scale, patch=STRIDE,
        embed_dim=attentions[0].q.conv.in_channels if type(attentions[0]) is Attention2d
        else attentions[0].k.conv.in_channels,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=tuple(biases),
        window_mix=tuple(mixes), read_tokens=channels_first,
    )


FAMILY = register(Family("timm EfficientFormer V2", adapter, recognises=recognises))
