"""timm's rotary-position attention: ``EvaAttention`` (EVA-02, DINOv3, PE) and ``AttentionRope``
(``vit_*_rope*``; Heo et al. 2024, "Rotary Position Embedding for Vision Transformer").

Both compute q, k = q_norm(q), k_norm(k) and THEN rotate the patch tokens' q and k by the RoPE table
the block passes in as ``rope=`` (prefix tokens are not rotated):

    q = cat(q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope, half=rotate_half))

Reading q and k at the norms alone gives weights that are off by up to 1.0. So we also read the
``rope`` tensor each attention module is called with (a forward pre-hook with kwargs) and, once the
forward pass is over, apply the same rotation with timm's own ``apply_rot_embed_cat`` to the stored
q and k. The Capture then holds post-RoPE q and k, and softmax(q · kᵀ · scale) is exact.
"""
from __future__ import annotations

import torch
from timm.layers import AttentionRope
from timm.layers.pos_embed_sincos import apply_rot_embed_cat
from timm.models.eva import EvaAttention

from ..errors import ModelError
from .base import Adapter
from .registry import Family, register
from .tap import Recorder, Tap
from .timm_vit import TimmAdapter, layout

ATTENTION = (EvaAttention, AttentionRope)


def rope_argument(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The ``rope=`` table an attention module is called with (the block passes it in)."""
    return kwargs.get("rope", args[1] if len(args) > 1 else None)


class TimmRopeAdapter(TimmAdapter):
    def attach(self, layer: int, tap: Tap) -> None:
        super().attach(layer, tap)
        tap.before(self.attentions[layer], layer, Recorder.put_extra, rope_argument)

    def finish(self, recorder: Recorder) -> None:
        for layer, attn in enumerate(self.attentions):
            rope = recorder.extras.get(layer)
            if rope is None:
                continue
            npt, half = attn.num_prefix_tokens, getattr(attn, "rotate_half", False)
            for store in (recorder.query, recorder.key):
                x = store[layer]  # (H, N, d_k); rope is (N − npt, 2 d_k), or (H, N − npt, 2 d_k) when mixed
                rotated = apply_rot_embed_cat(x[:, npt:], rope, half=half).type_as(x)
                # one whole-layer copy, as the hooks write: an ONNX export keeps it (attnviz.runtimes),
                # where it drops a write into a slice of a slice
                store[layer].copy_(torch.cat([x[:, :npt], rotated], dim=1))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    for block in network.blocks:
        if getattr(block.attn, "num_kv_groups", 1) > 1:
            raise ModelError(
                f"{type(network).__name__} uses grouped-query attention, which attnviz cannot read exactly yet."
            )
    return TimmRopeAdapter(family="timm RoPE", **layout(network, size))


FAMILY = register(Family("timm RoPE", adapter, attention=ATTENTION))
