"""timm's ``RelPosAttention`` (``vit_relpos_*``, ``vit_srelpos_*``): softmax(q · kᵀ · scale + B).

B is a learned relative-position bias (Swin-style table or log-coordinate MLP), (1, H, N, N) per
layer, or one shared by all layers (``shared_rel_pos``). It depends only on the weights and the grid,
never on the image, so it is computed once when the model is wrapped, with timm's own ``get_bias()``,
and every capture of that model shares it. q and k are read at ``q_norm`` / ``k_norm`` as usual.
"""
from __future__ import annotations

import torch
from timm.models.vision_transformer_relpos import RelPosAttention

from .base import Adapter
from .registry import Family, register
from .timm_vit import TimmAdapter, layout

ATTENTION = (RelPosAttention,)


@torch.no_grad()
def logit_bias(network: torch.nn.Module) -> torch.Tensor | None:
    """(L, H, N, N): the bias each layer adds to its logits, exactly as its forward pass does."""
    shared = network.shared_rel_pos.get_bias() if network.shared_rel_pos is not None else None
    per_layer = []
    for block in network.blocks:
        rel_pos = block.attn.rel_pos
        bias = rel_pos.get_bias() if rel_pos is not None else shared  # (1, H, N, N)
        per_layer.append(bias[0] if bias is not None else None)
    if all(b is None for b in per_layer):
        return None
    n = next(b for b in per_layer if b is not None).shape
    return torch.stack([b if b is not None else torch.zeros(n) for b in per_layer]).detach()


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    return TimmAdapter(family="timm relative position", bias=logit_bias(network), **layout(network, size))


FAMILY = register(Family("timm relative position", adapter, attention=ATTENTION))
