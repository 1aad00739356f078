"""timm's CrossViT (Chen et al. 2021, "CrossViT: Cross-Attention Multi-Scale Vision Transformer"): two
branches of patches of two sizes, each a plain ViT over its class token and patches, joined after every
multi-scale block by cross-attention.

Branch i resizes the photo to its own side (``img_size_scaled[i]``: 240 and 224 px in timm's models,
bicubic) and cuts it into ``patch_size[i]`` px patches (12 and 16: grids of 20 × 20 and 14 × 14), so both
grids cover the whole photo, branch i's token one (S / grid) px square of it (a layout's ``patch`` is the
branch's own patch on its resized photo: 16 px for branch 1, which covers 240 / 14 ≈ 17.1 px of the photo). Each ``MultiScaleBlock`` runs
branch 0's ViT blocks, then branch 1's (timm's ``Block``/``Attention``: softmax(q · kᵀ · d_k^−½) on the
fused SDPA path; q and k read at ``q_norm``/``k_norm``), then for i = 0, 1 a ``CrossAttentionBlock`` over
cat(projected class token of branch i, the patches of branch j = 1 − i): its one query is that class token
(``wq`` of token 0), its keys are that token and branch j's patches (``wk``), softmax((q · kᵀ) · d_k^−½)
computed eagerly. q and k are read at the outputs of ``wq`` and ``wk``.

The capture is a :class:`attnviz.Capture` with its own layouts with one stage per branch, each at its branch's
grid: stage i holds, multi-scale block after multi-scale block, branch i's self-attention layers (one
window of every token, the class token first) and then the cross-attention of branch i's class token
(``windows`` [[0]]; keys the class token and branch j's patches on branch j's grid: ``key_grid``,
``key_prefix`` 1). Block b of stage i is the b-th of those layers in the model's order; layers are
numbered in the model's order of softmaxes (per multi-scale block: branch 0's self-attention, branch
1's, cross-attention 0, cross-attention 1). Every layer's summary map is its class token's row: for a
cross-attention layer, over the other branch's patches. Token norms: a self-attention layer's block
output; a cross-attention layer's branch i after the fusion (its class token, projected back, and its
patches).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.layers import Attention
from timm.models.crossvit import CrossAttention, CrossAttentionBlock, CrossVit, MultiScaleBlock, PatchEmbed
from timm.models.vision_transformer import Block

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap, residual


def fusions(block: MultiScaleBlock) -> list[CrossAttentionBlock] | None:
    """The one cross-attention block of each branch, or None where a fusion has several (only the first
    of those sees the other branch's patches)."""
    out = []
    for fusion in block.fusion:
        if isinstance(fusion, torch.nn.Sequential):
            if len(fusion) != 1:
                return None
            fusion = fusion[0]
        out.append(fusion)
    return out


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not CrossVit or network.num_branches != 2:
        return False
    if not all(type(p) is PatchEmbed for p in network.patch_embed):
        return False
    for block in network.blocks:
        if type(block) is not MultiScaleBlock or block.blocks is None or len(block.blocks) != 2:
            return False
        if not all(type(b) is Block and type(b.attn) is Attention for branch in block.blocks for b in branch):
            return False
        cross = fusions(block)
        if cross is None or not all(type(c) is CrossAttentionBlock and type(c.attn) is CrossAttention for c in cross):
            return False
    return True


def heads_first(heads: int, x: torch.Tensor) -> torch.Tensor:
    """A Linear's (1, N, H · d_k) output → (H, 1, N, d_k): one window."""
    n = x.shape[1]
    return x[0].reshape(n, heads, -1).permute(1, 0, 2)[:, None]


def class_query(heads: int, x: torch.Tensor) -> torch.Tensor:
    """``wq``'s (1, 1, H · d_k) output (token 0 alone) → (H, 1, 1, d_k)."""
    return x[0].reshape(1, heads, -1).permute(1, 0, 2)[:, None]


def one_window(q: torch.Tensor) -> torch.Tensor:
    """``q_norm``/``k_norm`` output (1, H, N, d_k) → (H, 1, N, d_k)."""
    return q[0][:, None]


def branch_tokens(branch: int, output: list) -> torch.Tensor:
    """A multi-scale block's output (one (1, 1 + N_i, D_i) tensor per branch) → branch ``branch``'s tokens."""
    return output[branch][0]


class CrossVitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn, heads = self.attentions[layer], self.layouts[layer].num_heads
        if type(attn) is Attention:
            tap.after(attn.q_norm, layer, Recorder.put_query, one_window)
            tap.after(attn.k_norm, layer, Recorder.put_key, one_window)
        else:
            tap.after(attn.wq, layer, Recorder.put_query, partial(class_query, heads))
            tap.after(attn.wk, layer, Recorder.put_key, partial(heads_first, heads))


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    built = tuple(network.img_size)
    check_square_size(net, 1, size, None, dynamic=False)
    if built[0] != built[1]:
        raise ModelError(f"{net} was built for {built[0]} × {built[1]} px inputs; attnviz needs a square input "
                         "(build it with a square img_size).")
    if size != built[0]:  # the model resizes any photo to its branches' sides: those are its only tokens
        raise ModelError(f"{net} was built for {built[0]} px inputs (it resizes any other photo to that), not "
                         f"{size} px; build it with img_size={size}.")
    grids, patches = [], []
    for i, embed in enumerate(network.patch_embed):
        (h, w), (ph, pw) = embed.img_size, embed.patch_size
        if h != w or ph != pw or h % ph:
            raise ModelError(f"{net}'s branch {i} cuts {h} × {w} px into {ph} × {pw} px patches, which attnviz "
                             "cannot lay on a square grid.")
        if network.crop_scale and h != size:
            raise ModelError(f"{net}'s branch {i} crops the photo to {h} px (crop_scale), so its patches do not "
                             "cover the whole photo, which attnviz cannot draw.")
        grids.append((h // ph, h // ph))
        patches.append(ph)  # the branch's own patch, on its resized photo
    every = [torch.arange(1 + g[0] * g[1])[None] for g in grids]  # (1, 1 + N_i): the class token, then patches
    layouts, attentions, blocks, readers = [], [], [], []
    count = [0, 0]  # layers so far in each stage

    def add(lay_args: dict, stage: int, attn, block, reader) -> None:
        layouts.append(LayerLayout(stage, count[stage], **lay_args))
        count[stage] += 1
        attentions.append(attn)
        blocks.append(block)
        readers.append(reader)

    for multi in network.blocks:
        for i, branch in enumerate(multi.blocks):
            for b in branch:
                attn = b.attn
                add(dict(grid=grids[i], patch=patches[i], window=grids[i], shift=(0, 0), num_heads=attn.num_heads,
                         head_dim=attn.head_dim, scale=float(attn.scale), windows=every[i], prefix=1,
                         class_token=True), i, attn, b, residual)
        for i, cross in enumerate(fusions(multi)):
            j = 1 - i
            attn = cross.attn
            heads = attn.num_heads
            head_dim = attn.wq.weight.shape[0] // heads
            add(dict(grid=grids[i], patch=patches[i], window=grids[j], shift=(0, 0), num_heads=heads,
                     head_dim=head_dim, scale=float(attn.scale), windows=torch.zeros(1, 1, dtype=torch.long),
                     key_windows=every[j], key_grid=grids[j], prefix=1, key_prefix=1, class_token=True),
                i, attn, multi, partial(branch_tokens, i))
    first = layouts[0]
    return CrossVitAdapter(
        family="timm CrossViT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=patches[0], embed_dim=network.embed_dim[0],
        num_prefix_tokens=1, has_class_token=True, layouts=tuple(layouts), read_tokens=tuple(readers),
    )


FAMILY = register(Family("timm CrossViT", adapter, recognises=recognises))
