"""timm's second Swin V2 (``swin_transformer_v2_cr``, ``SwinTransformerV2Cr``; C. Reich's implementation):
cosine attention in shifted windows, with a position bias from a meta network.

Each block attends inside W windows of T = wh · ww tokens of its stage's grid (the window is 1/8 of
the first grid by default, the same in every stage), every other block after a cyclic shift by half a
window (``torch.roll``) with a mask of −100 between tokens the shift brought together from opposite
edges. Inside window w the weights are

    softmax(cos(q, k) · τ_h + B + M[w]),   τ_h = exp(min(logit_scale_h, ln 100)),

B (H, T, T) the output of a two-layer MLP (``meta_mlp``) over the log-spaced relative coordinates of
every pair of window cells (unlike Swin V2's ``16 · σ(CPB)``, no squashing). B and M depend only on
the weights and the grid, so they are computed once at wrap time, with the module's own MLP and mask.

The q and k are read at the output of the ``qkv`` projection (the model has no fused path: it always
computes this softmax eagerly); after the pass they are normalised as the model normalises them, and
q̂ · τ_h and k̂ are stored (with scale 1) so the logits are the cosine ones.

Blocks work on (B, H, W, C) maps, so a block's output is read as tokens in raster order directly.
The capture is a :class:`attnviz.Capture` with its own layouts: layer l = (stage, block), one grid per stage.
"""
from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from timm.models.swin_transformer_v2_cr import SwinTransformerV2Cr, SwinTransformerV2CrBlock, WindowMultiHeadAttention

from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_square_size, check_windows
from .registry import Family, register
from .tap import Recorder, Tap
from .timm_swin import window_part


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not SwinTransformerV2Cr:
        return False
    blocks = cr_blocks(network)
    return bool(blocks) and all(
        type(b) is SwinTransformerV2CrBlock and type(b.attn) is WindowMultiHeadAttention for b in blocks)


def cr_blocks(network: torch.nn.Module) -> list[torch.nn.Module]:
    return [block for stage in network.stages for block in stage.blocks]


@torch.no_grad()
def shift_mask(block: torch.nn.Module, grid: tuple[int, int]) -> torch.Tensor | None:
    """(W, T, T): −100 between tokens a shifted window joins from opposite edges, 0 elsewhere; None unshifted."""
    if not any(block.shift_size):
        return None
    if block.dynamic_mask:
        return block.get_attn_mask(torch.zeros(1, *grid, 1, dtype=block.norm1.weight.dtype))
    return block.attn_mask


class SwinCrAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        qkv, heads = self.attentions[layer].qkv, self.layouts[layer].num_heads
        tap.after(qkv, layer, Recorder.put_query, partial(window_part, heads, 0))  # raw q: (H, W, T, d_k)
        tap.after(qkv, layer, Recorder.put_key, partial(window_part, heads, 1))

    def finish(self, recorder: Recorder) -> None:
        for layer, attn in enumerate(self.attentions):
            # WindowMultiHeadAttention.forward: F.normalize(q) @ F.normalize(k)ᵀ, then × τ_h
            tau = torch.clamp(attn.logit_scale, max=math.log(1.0 / 0.01)).exp()  # (H,)
            q = F.normalize(recorder.query[layer], dim=-1)
            recorder.put_query(layer, q * tau.to(q.dtype)[:, None, None, None])
            recorder.put_key(layer, F.normalize(recorder.key[layer], dim=-1))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    embed = network.patch_embed
    patch = embed.patch_size[0]
    check_square_size(net, patch, size, tuple(embed.img_size), dynamic=False)
    layouts, biases, attentions, blocks = [], [], [], []
    for s, stage in enumerate(network.stages):
        for b, block in enumerate(stage.blocks):
            grid, window, shift = tuple(block.feat_size), tuple(block.window_size), tuple(block.shift_size)
            check_windows(net, size, f"stage {s + 1}", grid, window)
            attn = block.attn
            heads = attn.num_heads
            head_dim = attn.qkv.weight.shape[0] // 3 // heads
            windows = window_partition_index(grid, window, shift)  # (W, T)
            layouts.append(LayerLayout(s, b, grid, size // grid[0], window, shift, heads, head_dim, 1.0, windows))
            with torch.no_grad():
                bias = attn._relative_positional_encodings()  # (1, H, T, T): the meta network's bias
            mask = shift_mask(block, grid)
            bias = bias + mask[:, None] if mask is not None else bias.expand(windows.shape[0], -1, -1, -1)
            biases.append(bias.detach())  # (W, H, T, T)
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return SwinCrAdapter(
        family="timm Swin V2 (cr)", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=1.0, patch=patch, embed_dim=embed.proj.out_channels,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=tuple(biases),
    )


FAMILY = register(Family("timm Swin V2 (cr)", adapter, recognises=recognises))
