"""timm's BEiT ``Attention`` (BEiT, BEiT v2, data2vec-vision; Bao et al. 2022): softmax(q · kᵀ · scale + B).

B is a learned relative-position bias, Swin-style (a table indexed by the relative offset of two
patches, with three extra entries for the class token), per layer (``use_rel_pos_bias``) and/or one
shared by all layers (``use_shared_rel_pos_bias``); it depends only on the weights and the grid, so
it is computed once at wrap time with timm's own ``_get_rel_pos_bias()`` and ``rel_pos_bias()``.

BEiT's attention projects with ``F.linear(x, qkv.weight, cat(q_bias, 0, v_bias))`` rather than calling
its ``qkv`` module, so there is no module to hook whose output is q or k: a pre-hook reads the
attention's input x and the adapter computes q = x W_q + b_q and k = x W_k (+ 0) from the same weights,
in the same order of operations, as the model's forward does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.models.beit import Attention as BeitAttention

from .base import Adapter
from .registry import Family, register
from .tap import Recorder, Tap
from .timm_vit import TimmAdapter, layout

ATTENTION = (BeitAttention,)


def attention_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The (N, D) tokens an attention module is called with, for the one image in the batch."""
    return (args[0] if args else kwargs["x"])[0]


@torch.no_grad()
def logit_bias(network: torch.nn.Module) -> torch.Tensor | None:
    """(L, H, N, N): the bias each layer adds to its logits, as its forward pass adds it."""
    shared = network.rel_pos_bias() if network.rel_pos_bias is not None else None  # (H, N, N)
    per_layer = []
    for block in network.blocks:
        attn = block.attn
        bias = attn._get_rel_pos_bias()[0] if attn.relative_position_bias_table is not None else None
        if shared is not None:
            bias = shared if bias is None else bias + shared
        per_layer.append(bias)
    if all(b is None for b in per_layer):
        return None
    shape = next(b for b in per_layer if b is not None).shape
    return torch.stack([b if b is not None else torch.zeros(shape) for b in per_layer]).detach()


class BeitAdapter(TimmAdapter):
    def attach(self, layer: int, tap: Tap) -> None:
        tap.before(self.attentions[layer], layer, Recorder.put_extra, attention_input)

    def finish(self, recorder: Recorder) -> None:
        for layer, attn in enumerate(self.attentions):
            x = recorder.extras.pop(layer, None)  # (N, D); None if the pass never reached this layer
            if x is None:
                continue
            d = attn.num_heads * self.head_dim
            weight = attn.qkv.weight[: 2 * d]  # (2 · H · d_k, D): the q and k rows
            bias = None if attn.q_bias is None else torch.cat((attn.q_bias, attn.k_bias))
            if bias is not None and attn.qkv_bias_separate:
                qk = F.linear(x, weight) + bias  # the model adds the bias after its qkv module
            else:
                qk = F.linear(x, weight, bias)
            q, k = qk.reshape(x.shape[0], 2, attn.num_heads, self.head_dim).permute(1, 2, 0, 3)  # (H, N, d_k) each
            recorder.put_query(layer, q)
            recorder.put_key(layer, k)


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    first = network.blocks[0].attn
    head_dim = first.qkv.weight.shape[0] // 3 // first.num_heads
    return BeitAdapter(family="timm BEiT", bias=logit_bias(network), **layout(network, size, head_dim=head_dim))


FAMILY = register(Family("timm BEiT", adapter, attention=ATTENTION))
