"""timm's SAM ViT (``VisionTransformerSAM``; Kirillov et al. 2023, after Li et al. 2022's ViTDet): windowed and
global attention with a decomposed relative position.

Most blocks attend inside non-overlapping windows of 14 × 14 tokens of the one token grid (timm's
``window_partition``: windows in row-major order, tokens in row-major order inside each); a few
(``global_attn_indexes``) attend over every token. Where the grid does not divide into windows the
model pads it with tokens that are not in the photo, and the photo's tokens give them real weight;
attnviz refuses such a size rather than show them (samvit_base_patch16 at its own 1024 px: a 64 × 64
grid). Inside window w the weights are

    softmax(q · kᵀ · d_k^−½ + B(q)),

B(q) the decomposed relative position of MViTv2: for query (i, j) and key (k, l) of the window (or of
the whole grid), q · R_h[i, k] + q · R_w[j, l] with learned tables (interpolated where a global block
runs at a grid other than the one it was built for). B depends on the image, so the adapter computes
it after the pass with timm's own ``get_decomposed_rel_pos_bias`` on the recorded q.

q and k are read at the outputs of ``q_norm`` and ``k_norm`` (``nn.Identity`` unless ``qk_norm``): the
tensors the fused ``scaled_dot_product_attention`` and the eager path both take.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.vision_transformer_sam import Attention as SamAttention
from timm.models.vision_transformer_sam import VisionTransformerSAM, get_decomposed_rel_pos_bias

from ..errors import ModelError
from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    return type(network) is VisionTransformerSAM and all(type(b.attn) is SamAttention for b in network.blocks)


def heads_first(heads: int, output: torch.Tensor) -> torch.Tensor:
    """``q_norm``/``k_norm`` output (W · H, T, d_k) (windows of the one image, heads inside) → (H, W, T, d_k)."""
    return output.reshape(-1, heads, *output.shape[1:]).transpose(0, 1)


class SamAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        read = partial(heads_first, attn.num_heads)
        tap.after(attn.q_norm, layer, Recorder.put_query, read)
        tap.after(attn.k_norm, layer, Recorder.put_key, read)

    def finish(self, recorder: Recorder) -> None:
        for layer, attn in enumerate(self.attentions):
            lay = self.layouts[layer]
            if not attn.use_rel_pos:
                continue
            q = recorder.query[layer]  # (H, W, T, d_k)
            heads, windows, t, d = q.shape
            q = q.transpose(0, 1).reshape(windows * heads, t, d)  # as the model batches it: window, then head
            bias = get_decomposed_rel_pos_bias(q, attn.rel_pos_h, attn.rel_pos_w, lay.window, lay.window)
            recorder.put_bias(layer, bias.reshape(windows, heads, t, t).detach())


def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    embed = network.patch_embed
    patch = embed.patch_size[0]
    check_square_size(net, patch, size, tuple(embed.img_size), dynamic=not embed.strict_img_size)
    grid = (size // patch, size // patch)
    layouts, attentions = [], []
    for i, block in enumerate(network.blocks):
        attn = block.attn
        if attn.rope is not None:
            raise ModelError(f"{net} rotates its queries and keys (RoPE) inside windows, which attnviz cannot "
                             "read exactly yet, so it refuses it rather than show weights that may be wrong.")
        ws = block.window_size
        if ws > 0 and (grid[0] % ws or grid[1] % ws):
            raise ModelError(
                f"At {size} px, {net} has a {grid[0]} × {grid[1]} token grid that does not divide into its "
                f"{ws} × {ws} windows, so the model pads it with tokens that are not in the photo (and gives "
                f"them weight); attnviz refuses that size rather than show them (use a multiple of {ws * patch} px).")
        window = (ws, ws) if ws > 0 else grid
        windows = window_partition_index(grid, window, (0, 0))  # (W, T); global: one window of every token
        layouts.append(LayerLayout(0, i, grid, patch, window, (0, 0), attn.num_heads, attn.head_dim,
                                   float(attn.scale), windows))
        attentions.append(attn)
    lay = layouts[0]
    return SamAdapter(
        family="timm SAM ViT", attentions=tuple(attentions), blocks=tuple(network.blocks), num_heads=lay.num_heads,
        head_dim=lay.head_dim, scale=lay.scale, patch=patch, embed_dim=network.embed_dim,
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts),
    )


FAMILY = register(Family("timm SAM ViT", adapter, recognises=recognises))
