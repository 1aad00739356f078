"""timm's EfficientViT from MSRA (Liu et al. 2023): cascaded group attention inside local windows, with a learned bias.

Each block's token mixer cuts its stage's grid into non-overlapping windows of T = ws² tokens (no
shift; a grid of exactly one window attends over all of it) and runs cascaded group attention in each:
head h sees the h-th split of the channels plus head h − 1's output, projects it with its own 1 × 1
convolution ``qkvs[h]`` to [q (d_k), k (d_k), v (d_v)], and passes q through a depthwise convolution
``dws[h]`` over the window. Inside window w head h's weights are

    softmax(q_h · k_hᵀ · d_k^−½ + B_h),

B (H, T, T) a learned bias indexed by the |Δrow|, |Δcol| offset of two tokens in the window (LeViT's
attention bias), the same in every window; it is computed once at wrap time from the module's own table.
The model has one (eager) path. q_h is read at the output of ``dws[h]``, k_h at that of ``qkvs[h]``:
each hook writes its head's rows of the layer's q and k, so nothing is projected again.

A grid that does not divide into windows is padded by the model with zero tokens that are not in the
photo; attnviz refuses such a size. Layer l = (stage, block), each stage on its own grid; block outputs
are channels-first maps.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.efficientvit_msra import (
    CascadedGroupAttention,
    EfficientVitBlock,
    EfficientVitMsra,
    LocalWindowAttention,
)

from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_square_size, check_windows
from .registry import Family, register
from .tap import Recorder, Tap, channels_first

PATCH = 16  # the patch embedding's four stride-2 convolutions


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not EfficientVitMsra:
        return False
    blocks = efficientvit_blocks(network)
    return bool(blocks) and all(
        type(b) is EfficientVitBlock and type(b.mixer.m) is LocalWindowAttention
        and type(b.mixer.m.attn) is CascadedGroupAttention for b in blocks)


def efficientvit_blocks(network: torch.nn.Module) -> list[torch.nn.Module]:
    return [block for stage in network.stages for block in stage.blocks]


def window_tokens(start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
    """A (W, C, ws, ws) window map → channels ``start:stop`` as (W, T, stop − start) rows, in raster order."""
    return out[:, start:stop].flatten(2).transpose(1, 2)


def put_head_query(head: int, recorder: Recorder, layer: int, q: torch.Tensor) -> None:
    """Head ``head``'s (W, T, d_k) q into the layer's (H, W, T, d_k)."""
    recorder.query[layer][head].copy_(q)
    recorder.seen.add(("q", layer))


def put_head_key(head: int, recorder: Recorder, layer: int, k: torch.Tensor) -> None:
    recorder.key[layer][head].copy_(k)
    recorder.seen.add(("k", layer))


@torch.no_grad()
def attention_bias(attn: CascadedGroupAttention) -> torch.Tensor:
    """(1, H, T, T): the learned bias the module adds to every window's logits."""
    return attn.attention_biases[:, attn.attention_bias_idxs][None].detach().clone()


class EfficientVitMsraAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        d = attn.key_dim
        for head, (qkv, dw) in enumerate(zip(attn.qkvs, attn.dws)):
            tap.after(dw, layer, partial(put_head_query, head), partial(window_tokens, 0, d))
            tap.after(qkv, layer, partial(put_head_key, head), partial(window_tokens, d, 2 * d))


def down(side: int) -> int:
    """A 3 × 3, stride-2, padding-1 convolution's output side."""
    return (side - 1) // 2 + 1


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    check_square_size(net, PATCH, size, (network.img_size, network.img_size), dynamic=False)
    side = down(down(down(down(size))))  # after the patch embedding
    layouts, biases, attentions, blocks = [], [], [], []
    for s, stage in enumerate(network.stages):
        if stage.stride != 1:
            side = down(side)  # the subsampling PatchMerging's stride-2 depthwise convolution
        for b, block in enumerate(stage.blocks):
            attn = block.mixer.m.attn
            ws = attn.resolution
            check_windows(net, size, f"stage {s + 1}", (side, side), (ws, ws))
            grid, window = (side, side), (ws, ws)
            windows = window_partition_index(grid, window, (0, 0))  # (W, T)
            layouts.append(LayerLayout(s, b, grid, size // side, window, (0, 0), attn.num_heads, attn.key_dim,
                                       float(attn.scale), windows))
            biases.append(attention_bias(attn))
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return EfficientVitMsraAdapter(
        family="timm EfficientViT (MSRA)", attentions=tuple(attentions), blocks=tuple(blocks),
        num_heads=first.num_heads, head_dim=first.head_dim, scale=first.scale, patch=first.patch,
        embed_dim=network.stages[0].blocks[0].mixer.m.dim, num_prefix_tokens=0, has_class_token=False,
        layouts=tuple(layouts), window_bias=tuple(biases), read_tokens=channels_first,
    )


FAMILY = register(Family("timm EfficientViT (MSRA)", adapter, recognises=recognises))
