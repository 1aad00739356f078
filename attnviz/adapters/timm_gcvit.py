"""timm's GC ViT (Hatamizadeh et al. 2023, "Global Context Vision Transformers"): window attention in
stages, every other block with global queries made by a convolutional path.

Each stage cuts its token grid (h, w) into windows of T = wh · ww tokens (``window_partition``, as Swin's
without a shift) and every block attends inside them with weights softmax(q · kᵀ · d_k^−½ + B), B a learned
relative-position table (``RelPosBias``, (H, T, T)), the same for every window. The blocks alternate:

- local (even blocks): q, k and v are projected from the window's own tokens (``qkv``, 3 · C outputs);
- global (odd blocks): only k and v come from the window (``qkv``, 2 · C outputs); the queries are the
  stage's global query, a wh × ww map that MBConv blocks and poolings (``FeatureBlock``) make from the whole
  stage input, the same T queries for every window. Row t of every window is then the global query t, and
  the token that row writes to is the window's t-th token.

B depends only on the weights: computed once at wrap time with the module's own ``get_bias()``. k (and the
local q) are read at the output of ``qkv``; the global query at the attention module's input (a pre-hook),
copied into every window. GC ViT has only an eager path (no SDPA), so the capture is its own forward.

The global query's grid is fixed when the model is built (the number of poolings follows the built size),
so a model is read at the size it was built for only. The capture is a
:class:`attnviz.Capture` with its own layouts: layer l = (stage, block).
"""
from __future__ import annotations

from functools import partial

import torch
from timm.models.gcvit import GlobalContextVit, GlobalContextVitBlock, WindowAttentionGlobal

from ..errors import ModelError
from ..stages import LayerLayout, window_partition_index
from .base import Adapter, check_square_size
from .registry import Family, register
from .tap import Recorder, Tap


def recognises(network: torch.nn.Module) -> bool:
    return type(network) is GlobalContextVit and all(
        type(b) is GlobalContextVitBlock and type(b.attn) is WindowAttentionGlobal
        for stage in network.stages for b in stage.blocks)


def window_part(heads: int, parts: int, part: int, qkv: torch.Tensor) -> torch.Tensor:
    """``qkv``'s output (W, T, parts · H · d_k) of the one image → part ``part`` (q, k, v or k, v): (H, W, T, d_k)."""
    w, t, _ = qkv.shape
    return qkv.reshape(w, t, parts, heads, -1)[:, :, part].permute(2, 0, 1, 3)


def global_query(heads: int, args: tuple, kwargs: dict) -> torch.Tensor:
    """The stage's (1, wh, ww, C) global query an attention module is called with → (H, 1, T, d_k)."""
    q = args[1] if len(args) > 1 else kwargs["q_global"]
    return q.reshape(1, -1, heads, q.shape[-1] // heads).permute(2, 0, 1, 3)


def uses_global(attn: WindowAttentionGlobal) -> bool:
    return bool(attn.use_global)  # the stage always passes its global query; the module uses it when use_global


class GcVitAdapter(Adapter):
    def attach(self, layer: int, tap: Tap) -> None:
        attn = self.attentions[layer]
        heads = attn.num_heads
        if uses_global(attn):
            tap.before(attn, layer, Recorder.put_query, partial(global_query, heads))  # copied into every window
            tap.after(attn.qkv, layer, Recorder.put_key, partial(window_part, heads, 2, 0))
        else:
            tap.after(attn.qkv, layer, Recorder.put_query, partial(window_part, heads, 3, 0))
            tap.after(attn.qkv, layer, Recorder.put_key, partial(window_part, heads, 3, 1))


@torch.no_grad()
def adapter(network: torch.nn.Module, size: int) -> Adapter:
    net = type(network).__name__
    first_grid = tuple(network.stages[0].feat_size)
    built = (4 * first_grid[0], 4 * first_grid[1])  # the stem reduces by 4
    check_square_size(net, 4, size, built, dynamic=True)  # a whole number, a multiple of 4, square
    if size != built[0]:
        raise ModelError(
            f"{net} was built for {built[0]} px inputs, not {size} px, and the grid of its global queries is fixed "
            f"when it is built; build it with img_size={size}.")
    layouts, biases, attentions, blocks = [], [], [], []
    for s, stage in enumerate(network.stages):
        grid = tuple(stage.feat_size)
        for b, block in enumerate(stage.blocks):
            window, attn = tuple(block.window_size), block.attn
            if grid[0] % window[0] or grid[1] % window[1]:
                raise ModelError(
                    f"Stage {s + 1} of {net} has a {grid[0]} × {grid[1]} token grid that does not divide into its "
                    f"{window[0]} × {window[1]} windows, which the model cannot run at {size} px.")
            heads = attn.num_heads
            windows = window_partition_index(grid, window, (0, 0))  # (W, T)
            layouts.append(LayerLayout(s, b, grid, size // grid[0], window, (0, 0), heads, attn.head_dim,
                                       float(attn.scale), windows))
            t = windows.shape[1]
            biases.append(attn.rel_pos.get_bias().reshape(1, heads, t, t).detach().clone())
            attentions.append(attn)
            blocks.append(block)
    first = layouts[0]
    return GcVitAdapter(
        family="timm GC ViT", attentions=tuple(attentions), blocks=tuple(blocks), num_heads=first.num_heads,
        head_dim=first.head_dim, scale=first.scale, patch=first.patch, embed_dim=attentions[0].proj.weight.shape[0],
        num_prefix_tokens=0, has_class_token=False, layouts=tuple(layouts), window_bias=tuple(biases),
    )


FAMILY = register(Family("timm GC ViT", adapter, recognises=recognises))
