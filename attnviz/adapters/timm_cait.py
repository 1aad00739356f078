"""timm's CaiT, Class-Attention in Image Transformers (Touvron et al. 2021, "Going deeper with Image
Transformers"): talking-heads self-attention over the patches, then class-attention layers.

The first ``depth`` blocks (``LayerScaleBlock``, ``TalkingHeadAttn``) run on the patch tokens alone (no
class token yet). Their logits are mixed across the heads before the softmax (Shazeer et al. 2020,
"Talking-Heads Attention"): with ``proj_l`` a Linear over the head axis, head h's weights are

    softmax(Σ_g W_l[h, g] · (q_g · d_k^−½) · k_gᵀ + b_l[h]),

so the capture keeps each layer's q (= qkv's q rows; the model scales them by d_k^−½ before the
product) and k, the (H, H) mix W_l (``window_mix``) and b_l as a per-head constant (``window_bias``).
After the softmax ``proj_w`` mixes the heads' weights again before they weight v; what a head's
softmax gives is what attnviz shows, as the model computes it (the eager path has no fused variant).

The last ``depth_token_only`` blocks (``LayerScaleBlockClassAttn``, ``ClassAttn``) update only the
class token: it is the one query, q = W_q x_cls, over the keys of the class token and every patch,
softmax(q · kᵀ · d_k^−½) on timm's fused SDPA path. Those layers are one window whose one query is
token 0 (``windows`` [[0]]) and whose keys are all tokens, class token first; their summary map is the
class token's row. q and k are read at the outputs of ``q`` and ``k``.

The capture is a :class:`attnviz.Capture` with its own layouts of two stages on one grid: stage 0 the
talking-heads layers over the patches, stage 1 the class-attention layers.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.layers import PatchEmbed
from timm.models.cait import Cait, ClassAttn, LayerScaleBlock, LayerScaleBlockClassAttn, TalkingHeadAttn

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not Cait or type(network.patch_embed) is not PatchEmbed:
        return False
    talking = all(type(b) is LayerScaleBlock and type(b.attn) is TalkingHeadAttn for b in network.blocks)
    classes = all(type(b) is LayerScaleBlockClassAttn and type(b.attn) is ClassAttn
                  for b in network.blocks_token_only)
    return talking and classes


def qkv_part(heads: int, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """``qkv`` output (1, N, 3 · H · d_k) → q (part 0) or k (1) as one window: (H, 1, N, d_k)."""
    n = qkv.shape[1]
    return qkv[0].reshape(n, 3, heads, -1)[:, part].permute(1, 0, 2)[:, None]


def class_query(heads: int, q: torch.Tensor) -> torch.Tensor:
    """``q`` output (1, D) of the class token → (H, 1, 1, d_k): the one query of the one window."""
    return q[0].reshape(heads, 1, 1, -1)


def class_keys(heads: int, k: torch.Tensor) -> torch.Tensor:
    """``k`` output (1, N, D), the class token first → (H, 1, N, d_k)."""
    n = k.shape[1]
    return k[0].reshape(n, heads, -1).permute(1, 0, 2)[:, None]


class CaitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn, heads = self.attentions[layer], self.layouts[layer].num_heads
        if type(attn) is TalkingHeadAttn:
            tap.after(attn.qkv, layer, Recorder.put_query, partial(qkv_part, heads, 0))
            tap.after(attn.qkv, layer, Recorder.put_key, partial(qkv_part, heads, 1))
        else:
            tap.after(attn.q, layer, Recorder.put_query, partial(class_query, heads))
            tap.after(attn.k, layer, Recorder.put_key, partial(class_keys, heads))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    embed = network.patch_embed
    patch = embed.patch_size[0]
    if embed.patch_size[0] != embed.patch_size[1]:
        raise ModelError(f"{net} has non-square {tuple(embed.patch_size)} patches, which attnviz cannot lay on a grid.")
    check_square_size(net, patch, size, tuple(embed.img_size), dynamic=False)
    grid = (size // patch, size // patch)
    cells = grid[0] * grid[1]
    patches = torch.arange(cells)[None]  # (1, N): the patches alone, raster order
    layouts, attentions, blocks, biases, mixes = [], [], [], [], []
    for b, block in enumerate(network.blocks):
        attn = block.attn
        heads = attn.num_heads
        head_dim = attn.qkv.weight.shape[0] // 3 // heads
        layouts.append(LayerLayout(0, b, grid, patch, grid, (0, 0), heads, head_dim, float(attn.scale), patches))
        mixes.append(attn.proj_l.weight.detach().clone())  # (H, H): logits'[h] = Σ_g W[h, g] · logits[g]
        bias = attn.proj_l.bias
        biases.append(None if bias is None else bias.detach().clone().reshape(1, heads, 1, 1))
        attentions.append(attn)
        blocks.append(block)
    every = torch.arange(1 + cells)[None]  # (1, 1 + N): the class token, then the patches
    for b, block in enumerate(network.blocks_token_only):
        attn = block.attn
        heads = attn.num_heads
        layouts.append(LayerLayout(1, b, grid, patch, grid, (0, 0), heads, attn.q.weight.shape[0] // heads,
                                   float(attn.scale), torch.zeros(1, 1, dtype=torch.long), key_windows=every,
                                   prefix=1, class_token=True))
        mixes.append(None)
        biases.append(None)
        attentions.append(attn)
        blocks.append(block)
    first = layouts[0]
    return CaitAdapter(
        family="timm CaiT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=patch, embed_dim=network.embed_dim,
        num_prefix_tokens=1, has_class_token=True, layouts=tuple(layouts), window_bias=tuple(biases),
        window_mix=tuple(mixes),
    )


FAMILY = register(Family("timm CaiT", adapter, recognises=recognises))
