"""timm's PiT, the Pooling-based Vision Transformer (Heo et al. 2021, "Rethinking Spatial Dimensions of
Vision Transformers"): plain ViT attention in stages whose token grid a pooling layer shrinks.

A convolutional stem (``ConvEmbedding``: ``patch_size`` kernels at ``stride``, overlapping) makes the
first stage's h × w tokens; between stages ``Pooling`` halves the grid with a depthwise stride-2
convolution and maps the class token (and the distillation token of ``*_distilled_*``) with a Linear.
Each stage concatenates those prefix tokens before its grid cells in raster order and runs timm's
standard ``Block`` (``timm.layers.Attention``): every token attends to every token of its stage,
softmax(q · kᵀ · d_k^−½) with no bias. So each layer is one window (W = 1) of all its tokens, the
prefix first, and q and k are read at the attention's ``q_norm`` / ``k_norm`` (``Identity``), as for a
ViT; the fused SDPA path computes the same logits.

Token (r, c) of stage s is the feature at r · P_s, c · P_s px, P_s the stem's stride times 2^s (the
pooling strides): its ``patch``. The stem's kernels overlap (16 px at stride 8), so the first grid
(27 × 27 at 224 px) covers the photo with cells a little larger than their stride; the maps are laid on
that grid. The position embedding is a fixed (h, w) table, so PiT takes only the size it was built for.
"""
from __future__ import annotations

import torch
from timm.layers import Attention
from timm.models.pit import PoolingVisionTransformer
from timm.models.vision_transformer import Block

from ..errors import ModelError
from ..stages import LayerLayout
from .base import Adapter
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    if type(network) is not PoolingVisionTransformer:
        return False
    return all(type(b) is Block and type(b.attn) is Attention for b in pit_blocks(network))


def pit_blocks(network: torch.nn.Module) -> list[torch.nn.Module]:
    return [block for stage in network.transformers for block in stage.blocks]


def one_window(output: torch.Tensor) -> torch.Tensor:
    """``q_norm`` / ``k_norm`` output (1, H, N, d_k) → (H, 1, N, d_k): one window of every token."""
    return output[0].unsqueeze(1)


def conv_out(n: int, conv: torch.nn.Conv2d, axis: int) -> int:
    """Cells along ``axis`` after ``conv`` (zero padding, as ``nn.Conv2d`` computes them)."""
    k, s, p, d = conv.kernel_size[axis], conv.stride[axis], conv.padding[axis], conv.dilation[axis]
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


class PitAdapter(Adapter):
    """Reads q and k at each attention's ``q_norm`` / ``k_norm``, as one window of every token."""

    def grid(self, size: int) -> tuple[int, int]:
        return self.layouts[0].grid

    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        tap.after(attn.q_norm, layer, Recorder.put_query, one_window)
        tap.after(attn.k_norm, layer, Recorder.put_key, one_window)


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ModelError(f"The input size must be a positive whole number of pixels, not {size!r}.")
    embed = network.patch_embed
    built = tuple(embed.img_size)
    if built[0] != built[1]:
        raise ModelError(f"{net} was built for {built[0]} × {built[1]} px inputs; attnviz needs a square input "
                         "(build it with a square img_size).")
    if size != built[0]:
        raise ModelError(f"{net} was built for {built[0]} px inputs (its position embedding is a fixed "
                         f"{embed.height} × {embed.width} grid), not {size} px; build it with img_size={size}.")
    stride = embed.conv.stride[0]
    if embed.conv.stride[0] != embed.conv.stride[1]:
        raise ModelError(f"{net}'s stem has a non-square {tuple(embed.conv.stride)} stride, which attnviz cannot "
                         "lay on a grid.")
    grid = (embed.height, embed.width)
    prefix = network.cls_token.shape[1]  # the class token, and the distillation token when distilled
    layouts, attentions, blocks = [], [], []
    for s, stage in enumerate(network.transformers):
        if stage.pool is not None:
            conv = stage.pool.conv
            grid = (conv_out(grid[0], conv, 0), conv_out(grid[1], conv, 1))
            stride *= conv.stride[0]
        tokens = torch.arange(prefix + grid[0] * grid[1])[None]  # (1, N): one window, prefix then raster
        for b, block in enumerate(stage.blocks):
            attn = block.attn
            layouts.append(LayerLayout(s, b, grid, stride, grid, (0, 0), attn.num_heads, attn.head_dim,
                                       float(attn.scale), tokens, prefix=prefix, class_token=True))
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return PitAdapter(
        family="timm PiT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=first.patch, embed_dim=network.embed_dim,
        num_prefix_tokens=prefix, has_class_token=True, layouts=tuple(layouts),
    )


FAMILY = register(Family("timm PiT", adapter, recognises=recognises))
