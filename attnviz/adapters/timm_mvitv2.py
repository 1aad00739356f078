"""timm's MViTv2 (Li et al. 2022, "MViTv2: Improved Multiscale Vision Transformers"): pooled attention in stages.

Each block projects its tokens to q, k and v, then pools each of them with its own depthwise
convolution (and a LayerNorm): the queries to the block's output grid (halved at the first block of
a stage), the keys and values to a coarser grid (``stride_kv``: 14 × 14, then 7 × 7 at 224 px). A
class token, where the variant has one (``mvitv2_*_cls``), is not pooled and goes first among both.
The weights are

    softmax(q · kᵀ · d_k^−½ + B(q)),

where B(q) is the decomposed relative position of MViTv2: for query cell (i, j) and key cell (k, l),
q · R_h[i, k] + q · R_w[j, l] with learned tables R_h, R_w scaled to the two grids (zero in the class
token's row and column). B depends on the image (it is made from q), so the adapter computes it after
the pass with timm's own ``cal_rel_pos_type`` on the recorded q and puts it per layer.

q and k are read where the model's own forward has them: at the output of ``norm_q`` and ``norm_k``
(the LayerNorms after the pooling convolutions), the very tensors its ``(q · scale) @ kᵀ`` multiplies.
MViTv2 has no fused attention path: its forward always takes that eager softmax, so the capture runs
on the model's only path.

Every layer is one window of every query against every key (W = 1): ``grid`` the pooled query grid,
``key_grid`` the pooled key grid, a prefix of one class token where the variant has it.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.mvitv2 import MultiScaleAttention, MultiScaleVit, cal_rel_pos_type

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    return type(network) is MultiScaleVit


def blocks_of(network: torch.nn.Module) -> list[tuple[int, int, torch.nn.Module]]:
    return [(s, b, block) for s, stage in enumerate(network.stages) for b, block in enumerate(stage.blocks)]


def pooled(grid: tuple[int, int], conv: torch.nn.Module | None) -> tuple[int, int]:
    """The grid a pooling convolution (or None: no pooling) makes of ``grid``: PyTorch's output size."""
    if conv is None:
        return grid
    k, s, p = conv.kernel_size, conv.stride, conv.padding
    return tuple((grid[i] + 2 * p[i] - k[i]) // s[i] + 1 for i in range(2))


def pooled_heads(heads: int, output: torch.Tensor) -> torch.Tensor:
    """``norm_q``/``norm_k`` output (1, H, N, d_k) → (H, 1, N, d_k): one window of every token."""
    return output[0].reshape(heads, 1, *output.shape[2:])


class MvitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        read = partial(pooled_heads, attn.num_heads)
        tap.after(attn.norm_q, layer, Recorder.put_query, read)
        tap.after(attn.norm_k, layer, Recorder.put_key, read)

    def finish(self, recorder: Recorder) -> None:
        for layer, attn in enumerate(self.attentions):
            lay = self.layouts[layer]
            q = recorder.query[layer].transpose(0, 1)  # (1, H, Nq, d_k): the q the model's rel-pos term uses
            zero = torch.zeros(1, lay.num_heads, lay.num_tokens, lay.num_keys, dtype=q.dtype, device=q.device)
            bias = cal_rel_pos_type(zero, q, attn.has_cls_token, list(lay.grid), list(lay.keys_grid),
                                    attn.rel_pos_h, attn.rel_pos_w)  # (1, H, Nq, Nk) = (W, H, Tq, Tk)
            recorder.put_bias(layer, bias.detach())


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    conv = network.patch_embed.proj
    first = network.stages[0].blocks[0]
    stride0 = first.attn.pool_q.stride if first.attn.pool_q is not None else (1, 1)
    built = tuple(network.stages[0].feat_size[i] * stride0[i] * conv.stride[i] for i in range(2))
    check_square_size(net, conv.stride[0], size, built, dynamic=False)
    grid = pooled((size, size), conv)
    layouts, attentions, blocks = [], [], []
    for s, b, block in blocks_of(network):
        attn = block.attn
        if type(attn) is not MultiScaleAttention or attn.mode != "conv" or attn.norm_q is None or attn.norm_k is None:
            raise ModelError(f"{net} pools its attention without the convolutions and norms of timm's default "
                             "MViTv2 (mode 'conv', pooling before the projection or not at all), which attnviz "
                             "cannot read exactly yet, so it refuses it rather than show weights that may be wrong.")
        if attn.rel_pos_type != "spatial":
            raise ModelError(f"{net} has relative positions of type {attn.rel_pos_type!r}, which attnviz cannot "
                             "read exactly yet, so it refuses it rather than show weights that may be wrong.")
        q_grid, k_grid = pooled(grid, attn.pool_q), pooled(grid, attn.pool_k)
        if b == 0 and q_grid != tuple(network.stages[s].feat_size):
            raise ModelError(f"At {size} px, stage {s + 1} of {net} pools a {grid[0]} × {grid[1]} token grid to "
                             f"{q_grid[0]} × {q_grid[1]} rather than the {network.stages[s].feat_size[0]} × "
                             f"{network.stages[s].feat_size[1]} it was built for (use a size that halves evenly "
                             "at every stage).")
        heads = attn.num_heads
        prefix = int(attn.has_cls_token)
        nq, nk = prefix + q_grid[0] * q_grid[1], prefix + k_grid[0] * k_grid[1]
        layouts.append(LayerLayout(
            s, b, q_grid, size // q_grid[0], q_grid, (0, 0), heads, attn.head_dim, float(attn.scale),
            torch.arange(nq)[None], key_windows=torch.arange(nk)[None], key_grid=k_grid,
            prefix=prefix, key_prefix=prefix, class_token=bool(prefix)))
        attentions.append(attn)
        blocks.append(block)
        grid = q_grid
    lay = layouts[0]
    return MvitAdapter(
        family="timm MViTv2", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=lay.num_heads,
        head_dim=lay.head_dim, scale=lay.scale, patch=conv.stride[0], embed_dim=network.stages[0].blocks[0].dim,
        num_prefix_tokens=lay.prefix, has_class_token=lay.class_token, layouts=tuple(layouts),
    )


FAMILY = register(Family("timm MViTv2", adapter, recognises=recognises))
