"""timm's ConViT (d'Ascoli et al. 2021, "ConViT: Improving Vision Transformers with Soft Convolutional
Inductive Biases"): gated positional self-attention over the patches, then plain self-attention with a
class token.

The first ``local_up_to_layer`` blocks (``GPSA``) run on the patch tokens alone. Each head h takes two
softmaxes over the patches and blends them with a learned gate (ConViT eq. 5):

    A_h = normalise((1 − σ(λ_h)) · softmax(q_h · k_hᵀ · d_k^−½) + σ(λ_h) · softmax(v_pos,h · r)),

with r the relative position (δx, δy, δx² + δy²) of every query and key patch (``rel_indices``),
``pos_proj`` the Linear v_pos and λ the ``gating_param``; normalise divides each row by its sum. The
positional softmax and the gate depend only on the weights and the grid: they are computed once, when the
network is wrapped (``window_blend``), with the module's own ``get_rel_indices`` and ``pos_proj``. q and k
are read at the output of ``qk``. A GPSA layer's two parts are there on request
(:meth:`attnviz.Capture.part_weights`: ``"content"``, ``"positional"``).

Then the class token is put before the patches and the later blocks (``MHSA``) attend over every token,
softmax(q · kᵀ · d_k^−½) (eager in timm: ConViT has no fused path), q and k read at ``qkv``'s output.

The capture is a :class:`attnviz.Capture` with its own layouts of two stages on one grid: stage 0 the GPSA layers
(patches only), stage 1 the MHSA layers (class token first, its row their summary map).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.layers import PatchEmbed
from timm.models.convit import GPSA, MHSA, Block, ConVit

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    return (type(network) is ConVit and type(network.patch_embed) is PatchEmbed
            and all(type(b) is Block and type(b.attn) is (GPSA if b.use_gpsa else MHSA) for b in network.blocks))


def fused_part(parts: int, heads: int, part: int, out: torch.Tensor) -> torch.Tensor:
    """``qk`` (``parts`` 2) or ``qkv`` (3) output (1, N, parts · H · d_k) → q (part 0) or k (1) as one
    window: (H, 1, N, d_k), as timm's reshape (B, N, parts, H, d_k) reads it."""
    n = out.shape[1]
    return out[0].reshape(n, parts, heads, -1)[:, part].permute(1, 0, 2)[:, None]


@torch.no_grad()
def positional_part(attn: GPSA, cells: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(σ(gating_param) (H,), softmax(pos_proj(rel_indices)) (1, H, N, N)): GPSA's gate and positional
    weights over ``cells`` patches, in ``get_attention``'s order of operations."""
    rel = attn.get_rel_indices(cells)  # (1, N, N, 3)
    positional = attn.pos_proj(rel).permute(0, 3, 1, 2).softmax(dim=-1)  # (1, H, N, N)
    return torch.sigmoid(attn.gating_param).detach().clone(), positional


class ConvitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn, heads = self.attentions[layer], self.layouts[layer].num_heads
        fused, parts = (attn.qk, 2) if type(attn) is GPSA else (attn.qkv, 3)
        tap.after(fused, layer, Recorder.put_query, partial(fused_part, parts, heads, 0))
        tap.after(fused, layer, Recorder.put_key, partial(fused_part, parts, heads, 1))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    embed = network.patch_embed
    patch = embed.patch_size[0]
    if embed.patch_size[0] != embed.patch_size[1]:
        raise ModelError(f"{net} has non-square {tuple(embed.patch_size)} patches, which attnviz cannot lay on a grid.")
    check_square_size(net, patch, size, tuple(embed.img_size), dynamic=False)
    grid = (size // patch, size // patch)
    cells = grid[0] * grid[1]
    prefix = int(network.cls_token is not None)  # the class token joins before the first MHSA block
    patches = torch.arange(cells)[None]  # (1, N): the patches alone, raster order
    every = torch.arange(prefix + cells)[None]  # (1, 1 + N): the class token, then the patches
    layouts, blends = [], []
    for b, block in enumerate(network.blocks):
        attn = block.attn
        heads = attn.num_heads
        head_dim = attn.proj.in_features // heads
        if type(attn) is GPSA:
            layouts.append(LayerLayout(0, b, grid, patch, grid, (0, 0), heads, head_dim, float(attn.scale), patches))
            blends.append(positional_part(attn, cells))
        else:
            layouts.append(LayerLayout(1, b - network.local_up_to_layer, grid, patch, grid, (0, 0), heads, head_dim,
                                       float(attn.scale), every, prefix=prefix, class_token=bool(prefix)))
            blends.append(None)
    first = layouts[0]
    return ConvitAdapter(
        family="timm ConViT", attentions=tuple(b.attn for b in network.blocks), blocks=tuple(network.blocks),
        num_heads=first.num_heads, head_dim=first.head_dim, scale=first.scale, patch=patch,
        embed_dim=network.embed_dim, num_prefix_tokens=prefix, has_class_token=bool(prefix),
        layouts=tuple(layouts), window_blend=tuple(blends),
    )


FAMILY = register(Family("timm ConViT", adapter, recognises=recognises))
