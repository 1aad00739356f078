"""timm's Swin Transformer (Liu et al. 2021) and Swin V2 (Liu et al. 2022): windowed attention in stages.

Each block attends inside W windows of T = wh · ww tokens of its stage's grid, every other block after
a cyclic shift by half a window (``torch.roll``), with a mask of −100 between tokens the shift brought
together from opposite edges. Inside window w the weights are

- Swin:    softmax(q · kᵀ · d_k^−½ + B + M[w]), B a learned relative-position table (H, T, T);
- Swin V2: softmax(cos(q, k) · τ_h + 16 · σ(CPB) + M[w]): cosine attention with a learned per-head
  temperature τ_h = exp(min(logit_scale, ln 100)) and a continuous position bias, an MLP over
  log-spaced relative coordinates.

B (or 16 σ(CPB)) and M depend only on the weights and the grid, so they are computed once at wrap time,
with the module's own tables and buffers. For Swin the q and k are read at the output of the ``qkv``
projection (the fused SDPA path uses the same q and k); Swin V2 projects with ``F.linear`` and no
module, so a pre-hook reads the attention's windowed input and the q and k rows are projected after
the pass (two thirds of the model's own qkv projection again: its capture costs more than Swin's), then q̂ · τ_h and k̂ are stored (with scale 1) so the logits are the cosine ones.

The capture is a :class:`attnviz.Capture` with its own layouts: layer l = (stage, block), one grid per stage.
"""
from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer, WindowAttention
from timm.models.swin_transformer_v2 import SwinTransformerV2
from timm.models.swin_transformer_v2 import WindowAttention as WindowAttentionV2

from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_square_size, check_windows
from .registry import Family, register
from .tap import Recorder, Tap

NETWORKS = {SwinTransformer: WindowAttention, SwinTransformerV2: WindowAttentionV2}


def recognises(network: torch.nn.Module) -> bool:
    attention = NETWORKS.get(type(network))
    return attention is not None and all(type(b.attn) is attention for b in swin_blocks(network))


def swin_blocks(network: torch.nn.Module) -> list[torch.nn.Module]:
    return [block for stage in network.layers for block in stage.blocks]


def window_part(heads: int, part: int, qkv: torch.Tensor, parts: int = 3) -> torch.Tensor:
    """(W, T, parts · H · d_k) q, k(, v) of the one image's windows → its q (part 0) or k (1): (H, W, T, d_k)."""
    w, t, _ = qkv.shape
    return qkv.reshape(w, t, parts, heads, -1)[:, :, part].permute(2, 0, 1, 3)


def windowed_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The (W, T, C) windows an attention module is called with (batch of one image)."""
    return args[0] if args else kwargs["x"]


@torch.no_grad()
def position_bias(attn: torch.nn.Module) -> torch.Tensor:
    """(H, T, T): the bias the module adds to every window's logits."""
    if type(attn) is WindowAttention:
        return attn._get_rel_pos_bias()[0]
    t = attn.window_size[0] * attn.window_size[1]
    table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
    bias = table[attn.relative_position_index.view(-1)].view(t, t, -1).permute(2, 0, 1)  # (H, T, T)
    return 16 * torch.sigmoid(bias)


@torch.no_grad()
def shift_mask(block: torch.nn.Module, grid: tuple[int, int]) -> torch.Tensor | None:
    """(W, T, T): −100 between tokens a shifted window joins from opposite edges, 0 elsewhere; None unshifted."""
    if getattr(block, "dynamic_mask", False):
        return block.get_attn_mask(torch.zeros(1, *grid, 1))
    return block.attn_mask


class SwinAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        if type(attn) is WindowAttention:
            heads = self.layouts[layer].num_heads
            tap.after(attn.qkv, layer, Recorder.put_query, partial(window_part, heads, 0))
            tap.after(attn.qkv, layer, Recorder.put_key, partial(window_part, heads, 1))
        else:
            tap.before(attn, layer, Recorder.put_extra, windowed_input)

    def finish(self, recorder: Recorder) -> None:
        for layer, attn in enumerate(self.attentions):
            x = recorder.extras.pop(layer, None)  # Swin V2: (W, T, C)
            if x is None:
                continue
            qk = project(attn, x)  # (W, T, 2 · H · d_k)
            q = F.normalize(window_part(attn.num_heads, 0, qk, parts=2), dim=-1)  # (H, W, T, d_k)
            k = F.normalize(window_part(attn.num_heads, 1, qk, parts=2), dim=-1)
            tau = torch.clamp(attn.logit_scale, max=math.log(1.0 / 0.01)).exp()  # (H, 1, 1)
            recorder.put_query(layer, q * tau[:, None])
            recorder.put_key(layer, k)


def project(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Swin V2's q and k projection of ``x`` (its qkv's first two thirds: v is not needed), with the
    same weights and biases as ``WindowAttention.forward``: (W, T, 2 · H · d_k)."""
    rows = 2 * attn.qkv.weight.shape[0] // 3
    weight = attn.qkv.weight[:rows]
    if attn.q_bias is None:
        bias = None if attn.qkv.bias is None else attn.qkv.bias[:rows]
        return F.linear(x, weight, bias)
    bias = torch.cat((attn.q_bias, attn.k_bias))
    if attn.qkv_bias_separate:
        qk = F.linear(x, weight, None if attn.qkv.bias is None else attn.qkv.bias[:rows])
        return qk + bias
    return F.linear(x, weight, bias)


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    embed = network.patch_embed
    patch = embed.patch_size[0]
    check_square_size(net, patch, size, tuple(embed.img_size), dynamic=False)
    layouts, biases, attentions, blocks = [], [], [], []
    for s, stage in enumerate(network.layers):
        for b, block in enumerate(stage.blocks):
            grid, window, shift = tuple(block.input_resolution), tuple(block.window_size), tuple(block.shift_size)
            check_windows(net, size, f"stage {s + 1}", grid, window)
            attn = block.attn
            heads = attn.num_heads
            head_dim = attn.qkv.weight.shape[0] // 3 // heads
            windows = window_partition_index(grid, window, shift)  # (W, T)
            scale = float(attn.scale) if type(attn) is WindowAttention else 1.0
            layouts.append(LayerLayout(s, b, grid, size // grid[0], window, shift, heads, head_dim, scale, windows))
            bias = position_bias(attn)[None]  # (1, H, T, T)
            mask = shift_mask(block, grid) if any(shift) else None
            bias = bias + mask[:, None] if mask is not None else bias.expand(windows.shape[0], -1, -1, -1)
            biases.append(bias.detach())  # (W, H, T, T)
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return SwinAdapter(
        family="timm Swin", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=patch, embed_dim=network.embed_dim,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=tuple(biases),
    )


FAMILY = register(Family("timm Swin", adapter, recognises=recognises))
