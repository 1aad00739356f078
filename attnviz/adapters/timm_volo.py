"""timm's VOLO, Vision Outlooker (Yuan et al. 2021): outlook attention, then self-attention stages, then
class-attention layers.

The first stage (``Outlooker`` blocks, ``OutlookAttention``) weighs each location's k × k neighbourhood
with weights a Linear makes from that location's token alone (a (k², k²) softmax per head, no product
of a query with keys) and folds the weighted values back onto the neighbourhood. No weight in it is a
query's attention over keys, so attnviz does not read those layers; the page says so in one sentence
(``unread``).

After a 2 × 2 downsampling the ``Transformer`` stages attend globally, softmax(q · kᵀ · d_k^−½) over
every token of the stage's grid (``volo.Attention`` on timm's fused SDPA path; q and k are read at the
output of ``qkv``, whose rows are [q, k, v] per head). Then the ``ClassBlock`` layers (``ClassAttention``)
update a class token: it is the one query, q = W_q x_cls, over the keys W_k x of the class token and
every patch (``kv``'s first half), softmax(q · d_k^−½ · kᵀ), computed eagerly by timm. Those layers are
one window whose one query is token 0 and whose keys are all tokens, class token first.

The capture is a :class:`attnviz.Capture` with its own layouts: one stage per ``Transformer`` stage, then one of
the class-attention layers, all on the downsampled grid (16 px tokens). Its position embedding is
learned for the grid the model was built for, so that size is the only one it takes.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.volo import VOLO, Attention, ClassAttention, ClassBlock, Downsample, Outlooker, Transformer

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap

UNREAD = "stages.unread_volo"


def stage_kinds(network: torch.nn.Module) -> list[type] | None:
    """The block class of each stage of ``network.network`` (Downsample entries left out), or None when a
    stage mixes them or has one attnviz does not know, or a Downsample follows a Transformer stage."""
    kinds = []
    for stage in network.network:
        if type(stage) is Downsample:
            if Transformer in kinds:  # the Transformer stages must share one grid
                return None
            continue
        if not isinstance(stage, torch.nn.Sequential):
            return None
        types = {type(b) for b in stage}
        if len(types) != 1 or not types <= {Outlooker, Transformer}:
            return None
        kinds.append(types.pop())
    return kinds


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not VOLO or not network.post_network or stage_kinds(network) is None:
        return False
    attention = all(type(b.attn) is Attention for s in transformer_stages(network) for b in s)
    classes = all(type(b) is ClassBlock and type(b.attn) is ClassAttention for b in network.post_network)
    return attention and classes


def transformer_stages(network: torch.nn.Module) -> list[torch.nn.Module]:
    return [s for s in network.network if isinstance(s, torch.nn.Sequential) and type(s[0]) is Transformer]


def qkv_part(heads: int, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """``qkv`` output (1, h, w, 3 · H · d_k) → q (part 0) or k (1) as one window: (H, 1, h · w, d_k)."""
    x = qkv[0].reshape(-1, 3, heads, qkv.shape[-1] // 3 // heads)
    return x[:, part].permute(1, 0, 2)[:, None]


def class_query(heads: int, q: torch.Tensor) -> torch.Tensor:
    """``q`` output (1, 1, H · d_k) of the class token → (H, 1, 1, d_k)."""
    return q[0].reshape(heads, 1, 1, -1)


def class_keys(heads: int, kv: torch.Tensor) -> torch.Tensor:
    """``kv`` output (1, N, 2 · H · d_k), the class token first → its keys (H, 1, N, d_k)."""
    n = kv.shape[1]
    return kv[0].reshape(n, 2, heads, -1)[:, 0].permute(1, 0, 2)[:, None]


class VoloAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn, heads = self.attentions[layer], self.layouts[layer].num_heads
        if type(attn) is Attention:
            tap.after(attn.qkv, layer, Recorder.put_query, partial(qkv_part, heads, 0))
            tap.after(attn.qkv, layer, Recorder.put_key, partial(qkv_part, heads, 1))
        else:
            tap.after(attn.q, layer, Recorder.put_query, partial(class_query, heads))
            tap.after(attn.kv, layer, Recorder.put_key, partial(class_keys, heads))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    if network.pos_embed is None:
        raise ModelError(f"{net} has no position embedding here, which attnviz does not know how to lay on a grid.")
    grid = tuple(network.pos_embed.shape[1:3])  # the tokens after the downsampling, learned for one size
    embed = network.patch_embed
    patch = (1 if embed.conv is None else embed.conv[0].stride[0]) * embed.proj.stride[0]
    for m in network.network:  # the downsamplings, all before the first Transformer stage (recognises)
        if type(m) is Downsample:
            patch *= m.proj.stride[0]
    if grid[0] != grid[1]:
        raise ModelError(f"{net} was built for a {grid[0]} × {grid[1]} token grid; attnviz needs a square one.")
    check_square_size(net, patch, size, (grid[0] * patch, grid[1] * patch), dynamic=False)
    cells = grid[0] * grid[1]
    layouts, attentions, blocks = [], [], []
    every = torch.arange(cells)[None]  # (1, N): one window of every token, raster order
    for s, stage in enumerate(transformer_stages(network)):
        for b, block in enumerate(stage):
            attn = block.attn
            heads = attn.num_heads
            head_dim = attn.qkv.weight.shape[0] // 3 // heads
            layouts.append(LayerLayout(s, b, grid, patch, grid, (0, 0), heads, head_dim, float(attn.scale), every))
            attentions.append(attn)
            blocks.append(block)
    classes = len(transformer_stages(network))
    with_class = torch.arange(1 + cells)[None]  # the class token, then the patches
    for b, block in enumerate(network.post_network):
        attn = block.attn
        layouts.append(LayerLayout(classes, b, grid, patch, grid, (0, 0), attn.num_heads, attn.head_dim,
                                   float(attn.scale), torch.zeros(1, 1, dtype=torch.long), key_windows=with_class,
                                   prefix=1, class_token=True))
        attentions.append(attn)
        blocks.append(block)
    last = layouts[-1]
    return VoloAdapter(
        family="timm VOLO", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=last.num_heads,
        head_dim=last.head_dim, scale=last.scale, patch=patch, embed_dim=network.num_features,
        num_prefix_tokens=1, has_class_token=True, layouts=tuple(layouts), unread=UNREAD,
    )


FAMILY = register(Family("timm VOLO", adapter, recognises=recognises))
