"""timm's XCiT, Cross-Covariance Image Transformers (El-Nouby et al. 2021): cross-covariance attention over
channels, then class-attention layers.

The ``depth`` main blocks (``XCABlock``, ``XCA``) attend across channels, not tokens: per head, the
softmax of the d_k × d_k cross-covariance of the l2-normalised q and k (over the tokens), scaled by a
learned temperature, mixes each token's value channels. No weight in it is one token's on another, so
these layers have no token map and attnviz does not read them; the page says so in one sentence
(``unread``). Tokens meet in them only through the local patch interaction (``LPI``, depthwise
convolutions).

The last ``cls_attn_layers`` blocks (``ClassAttentionBlock``, CaiT's ``ClassAttn``) update the class
token: it is the one query, q = W_q x_cls, over the keys of the class token and every patch,
softmax(q · kᵀ · d_k^−½), on timm's fused SDPA path. Those layers are one window whose one query is
token 0 and whose keys are all tokens, class token first (as CaiT's class attention,
:mod:`.timm_cait`); q and k are read at the outputs of ``q`` and ``k``.

The capture is a :class:`attnviz.Capture` with its own layouts of one stage: the class-attention layers on the
patch grid. XCiT takes any input whose side is a multiple of its patch (its Fourier position encoding
and convolutions follow the grid).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.cait import ClassAttn
from timm.models.xcit import XCA, ClassAttentionBlock, ConvPatchEmbed, Xcit, XCABlock

from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap
from .timm_cait import class_keys, class_query

UNREAD = "stages.unread_xcit"


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not Xcit or type(network.patch_embed) is not ConvPatchEmbed or not network.cls_attn_blocks:
        return False
    main = all(type(b) is XCABlock and type(b.attn) is XCA for b in network.blocks)
    classes = all(type(b) is ClassAttentionBlock and type(b.attn) is ClassAttn for b in network.cls_attn_blocks)
    return main and classes


class XcitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn, heads = self.attentions[layer], self.layouts[layer].num_heads
        tap.after(attn.q, layer, Recorder.put_query, partial(class_query, heads))
        tap.after(attn.k, layer, Recorder.put_key, partial(class_keys, heads))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    patch = int(network.patch_embed.patch_size)
    check_square_size(net, patch, size, None, dynamic=True)
    grid = (size // patch, size // patch)
    every = torch.arange(1 + grid[0] * grid[1])[None]  # (1, 1 + N): the class token, then the patches
    layouts, attentions, blocks = [], [], []
    for b, block in enumerate(network.cls_attn_blocks):
        attn = block.attn
        heads = attn.num_heads
        layouts.append(LayerLayout(0, b, grid, patch, grid, (0, 0), heads, attn.q.weight.shape[0] // heads,
                                   float(attn.scale), torch.zeros(1, 1, dtype=torch.long), key_windows=every,
                                   prefix=1, class_token=True))
        attentions.append(attn)
        blocks.append(block)
    first = layouts[0]
    return XcitAdapter(
        family="timm XCiT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=patch, embed_dim=network.embed_dim,
        num_prefix_tokens=1, has_class_token=True, layouts=tuple(layouts), unread=UNREAD,
    )


FAMILY = register(Family("timm XCiT", adapter, recognises=recognises))
