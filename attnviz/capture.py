"""Capture every layer's and head's attention in one forward pass, at the cost of a plain forward.

The attention weights of layer l are A = softmax(Q Kᵀ / √d_k + B) (Vaswani et al. 2017), with B a
relative-position bias in the models that have one (zero otherwise). Rather than materialising all
L × H × N × N weights (540 MB at 518 px), we keep what they are made of — each layer's queries and
keys, O(L · N · D) — read through the model family's adapter (:mod:`attnviz.adapters`) while the
model runs its normal fused forward. The adapter makes q and k exactly the ones that enter the
softmax (after q_norm / k_norm and, for RoPE models, after the rotation). Any row or matrix is then
recomputed on demand: softmax((q · scale) @ kᵀ + B), with the precision explained at
``_softmax_scores``.

Alongside, each token's L2 norm after every layer is kept, O(L · N): Darcet et al. 2024 ("Vision
Transformers Need Registers") show that some models repurpose a few background patches as
high-norm tokens that soak up attention; :meth:`Capture.high_norm` says whether this capture has any.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from PIL import Image

from .adapters import Recorder
from .errors import ImageError, LayoutError, NoClassTokenError
from .images import as_rgb
from .models import FITS, Fit, Model
from .preparation import Preparation, preparation
from .softmax import Head, fuse_heads, patch_grid, softmax_scores, whole
from .stages import PARTS, LayerLayout, blended, global_layout, mean_received, mixed_softmax

_softmax_scores, _whole = softmax_scores, whole  # the names this module used before #22

# A patch token is "high-norm" when its norm after a layer exceeds this multiple of that layer's median
# patch-token norm. Darcet et al. 2024 (Fig. 3) find such tokens an order of magnitude above the rest
# (a bimodal histogram); on the sample photos no patch of the offline ViT-S/14 reaches 2× the median
# at 196 px (largest 1.91×, astronaut.jpg, layer 11). 3× sits clear of both.
HIGH_NORM_RATIO = 3.0
Summary = Literal["cls", "mean_received"]


@dataclass(frozen=True)
class Window:
    """One window of one layer: exactly what its softmax is made of (:meth:`Capture.window`).

    The weights of head h are softmax(query[h] · key[h]ᵀ · scale + bias[h]) over the window's keys; every
    token outside the window gets 0. A plain ViT's layer is one window of all N tokens."""

    layer: int
    index: int  # the window's number in its layer (0 for a plain ViT)
    queries: np.ndarray  # (Tq,) the token of each query row
    keys: np.ndarray  # (Tk,) the token of each key column
    query: torch.Tensor  # (H, Tq, d_k)
    key: torch.Tensor  # (H, Tk, d_k)
    bias: torch.Tensor | None  # (H, Tq, Tk) additive logit bias (relative position, shifted-window mask), or None
    scale: float  # 1 / √d_k

    def row(self, token: int) -> int:
        """The query row of token ``token`` in this window."""
        return int(np.flatnonzero(self.queries == token)[0])

    def logits(self, head: int) -> np.ndarray:
        """(Tq, Tk) float64: q · kᵀ · scale + bias of one head."""
        q, k = self.query[head].double().cpu().numpy(), self.key[head].double().cpu().numpy()
        logits = np.einsum("id,jd->ij", q * self.scale, k)  # einsum: no BLAS threads
        if self.bias is not None:
            logits = logits + self.bias[head].double().cpu().numpy()
        return logits


@dataclass(frozen=True, eq=False)
class Capture:
    """One image's attention, every layer and head, for every model. Layers, heads and tokens are 0-based.

    Layer l has its own token layout (:class:`~attnviz.stages.LayerLayout`): its stage and block, its grid of
    tokens, its windows and the tokens before the grid (a class token, registers). A plain ViT's layers are
    the blocks of one stage with one window of all N tokens; Swin's are four stages of shifted windows; CaiT's
    last layers have the class token as their only query. Every question is asked the same way of any model.

    ``query[l]`` (H, W, Tq, d_k) and ``key[l]`` (H, W, Tk, d_k): per head and window, exactly the vectors that
    entered softmax(Q Kᵀ · scale + bias) — after timm's ``q_norm`` / ``k_norm`` and, for RoPE models, after the
    rotation. ``bias[l]`` is the additive logit bias (relative position, shifted-window mask), (W, H, Tq, Tk) or
    broadcastable, shared by every capture of the same model; None where a layer has none.
    """

    query: tuple[torch.Tensor, ...]  # per layer (H, W, Tq, d_k)
    key: tuple[torch.Tensor, ...]  # per layer (H, W, Tk, d_k)
    bias: tuple[torch.Tensor | None, ...]  # per layer (W, H, Tq, Tk) or broadcastable, or None
    layouts: tuple[LayerLayout, ...]
    input: torch.Tensor  # (1, 3, S, S): the exact tensor the model received
    output: torch.Tensor  # (C,): logits for a classifier, pooled features otherwise
    seconds: float  # wall time of the forward pass with capture
    token_norms: tuple[torch.Tensor, ...] = ()  # per layer (N_l,): ‖x_i‖ of every token after the layer's block
    prepared: Preparation | None = None  # model name and how the photo became ``input``
    mix: tuple[torch.Tensor | None, ...] = ()  # per layer (H, H): talking heads' mix of the logits, or None
    # per layer None or (gate (H,), positional weights (W, H, Tq, Tk)): the weights are
    # normalise((1 − gate) · content + gate · positional), content the softmax of the logits (ConViT's GPSA)
    blend: tuple[tuple[torch.Tensor, torch.Tensor] | None, ...] = ()
    note: str | None = None  # the adapter's ``unread``: locale key of why some of the model's layers are not read

    @classmethod
    def of_tokens(cls, query: torch.Tensor, key: torch.Tensor, scale: float, grid: tuple[int, int],
                  num_prefix_tokens: int, input: torch.Tensor, output: torch.Tensor, seconds: float = 0.0,
                  bias: torch.Tensor | None = None, has_class_token: bool = True,
                  token_norms: torch.Tensor | None = None, prepared: Preparation | None = None) -> "Capture":
        """The capture of a plain ViT from its stacked queries and keys, (L, H, N, d_k): L layers of one stage,
        one window of every token each; ``bias`` (L, H, N, N), ``token_norms`` (L, N). No copies are made."""
        layers, heads, n, d = query.shape
        grid = (int(grid[0]), int(grid[1]))
        tokens = torch.arange(n)[None]  # (1, N): one window, shared by every layer
        patch = input.shape[-1] // grid[1]
        layouts = tuple(global_layout(layer, grid, patch, heads, d, float(scale), int(num_prefix_tokens),
                                      bool(has_class_token), tokens) for layer in range(layers))
        return cls(query=tuple(query[:, :, None].unbind(0)), key=tuple(key[:, :, None].unbind(0)),
                   bias=tuple(bias[:, None].unbind(0)) if bias is not None else (None,) * layers,
                   layouts=layouts, input=input, output=output, seconds=seconds,
                   token_norms=tuple(token_norms.unbind(0)) if token_norms is not None else (), prepared=prepared)

    # ---- the layers and their tokens ----

    @property
    def num_layers(self) -> int:
        return len(self.layouts)

    def layout(self, layer: int) -> LayerLayout:
        """Layer ``layer``'s tokens: its stage, block, grid, windows, heads and scale."""
        layer = whole(layer, "layer")
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} is outside 0…{self.num_layers - 1}")
        return self.layouts[layer]

    def heads(self, layer: int) -> int:
        """How many heads layer ``layer`` has."""
        return self.layout(layer).num_heads

    @property
    def num_heads(self) -> int:
        """The most heads any layer has (every layer's, in a model whose layers all have as many)."""
        return max(lay.num_heads for lay in self.layouts)

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w): the first layer's token grid, the photo's patches; a layer's own is ``layout(l).grid``."""
        return self.layouts[0].grid

    def map_grid(self, layer: int) -> tuple[int, int]:
        """(h, w): the grid a map of layer ``layer`` is drawn on (its keys' grid)."""
        return self.layout(layer).keys_grid

    @property
    def num_tokens(self) -> int:
        """N of the first layer: its prefix tokens and its grid's cells."""
        return self.layouts[0].num_tokens

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the grid's cells at the last layer (the class token first, then registers)."""
        return self.layouts[-1].prefix

    @property
    def has_class_token(self) -> bool:
        """Whether the model has a class token that attends (in some layers, for CaiT: :meth:`summary_kind`)."""
        return any(lay.class_row for lay in self.layouts)

    @property
    def summary(self) -> Summary:
        """What :meth:`summary_map` shows at every layer: ``"cls"`` where the class token is a query at every
        layer, else ``"mean_received"`` (per layer: :meth:`summary_kind`)."""
        return "cls" if all(lay.class_row for lay in self.layouts) else "mean_received"

    @property
    def stages(self) -> tuple[tuple[int, ...], ...]:
        """The layers of each stage: ``stages[s]`` lists the layer indices of its blocks, in order."""
        out: dict[int, list[int]] = {}
        for layer, lay in enumerate(self.layouts):
            out.setdefault(lay.stage, []).append(layer)
        return tuple(tuple(v) for _, v in sorted(out.items()))

    def layer_of(self, stage: int, block: int) -> int:
        return self.stages[stage][block]

    def same_tokens(self, layers: Sequence[int]) -> bool:
        """Whether ``layers`` all attend over one token set (same queries, keys and grid): what a product of
        their matrices, such as rollout, needs."""
        first = self.layout(layers[0])
        return all((lay.grid, lay.keys_grid, lay.prefix, lay.num_key_prefix, lay.num_tokens, lay.num_keys) ==
                   (first.grid, first.keys_grid, first.prefix, first.num_key_prefix, first.num_tokens, first.num_keys)
                   for lay in map(self.layout, layers))

    @property
    def uniform(self) -> bool:
        """Whether every layer has one window of the same N tokens and the same heads (a plain ViT): then the
        layers' (H, N, N) matrices stack into one (L, H, N, N) array, as files and pages store them compactly."""
        return (all(lay.is_global for lay in self.layouts) and self.same_tokens(range(self.num_layers))
                and len({lay.num_heads for lay in self.layouts}) == 1)

    @property
    def nbytes(self) -> int:
        """Memory held by this capture's own tensors (a relative-position bias is the model's, shared)."""
        own = [*self.query, *self.key, self.input, self.output, *self.token_norms]
        return sum(t.element_size() * t.nelement() for t in own)

    def _check(self, layer: int, query: int | None = None) -> LayerLayout:
        lay = self.layout(layer)
        if query is not None:
            query = whole(query, "query token")
            if not 0 <= query < lay.num_tokens:
                raise IndexError(f"query token {query} is outside 0…{lay.num_tokens - 1}")
        return lay

    # ---- the weights ----

    def _mix(self, layer: int) -> torch.Tensor | None:
        return self.mix[layer] if self.mix else None

    def _blend(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.blend[layer] if self.blend else None

    def gate(self, layer: int) -> torch.Tensor | None:
        """(H,): the weight of the positional part in each head of a blended layer (None: no blend)."""
        self.layout(layer)
        blend = self._blend(layer)
        return None if blend is None else blend[0]

    def plain_softmax(self, layer: int) -> bool:
        """Whether layer ``layer``'s weights are softmax(q · kᵀ · scale + bias) per head alone: no talking heads
        mixing the heads' logits, no gated blend (what the neuron view and the Q/K map take apart)."""
        self.layout(layer)
        return self._mix(layer) is None and self._blend(layer) is None

    def _part(self, layer: int, part: str | None) -> str | None:
        if part not in PARTS:
            raise ValueError(f"part must be one of {', '.join(repr(p) for p in PARTS)}, not {part!r}")
        if part == "positional" and self._blend(layer) is None:
            raise ValueError(f"layer {layer} has no positional part: its weights are the softmax of q · kᵀ alone")
        return part

    def window_weights(self, layer: int, part: str | None = None) -> torch.Tensor:
        """(W, H, Tq, Tk): every window's weights, as the model computes them; ``part`` ``"content"`` or
        ``"positional"``: that part of a blended layer's weights (``"content"`` of any other layer: its weights)."""
        lay = self.layout(layer)
        part = self._part(layer, part)
        blend = self._blend(layer)
        if part == "positional":
            return blend[1].expand(lay.num_windows, lay.num_heads, -1, -1)
        q, k = self.query[layer], self.key[layer]  # (H, W, Tq, d_k), (H, W, Tk, d_k)
        bias = self.bias[layer]
        scores = mixed_softmax(q, k, lay.scale, None if bias is None else bias.transpose(0, 1), self._mix(layer))
        scores = scores.transpose(0, 1)
        if blend is None or part == "content":
            return scores
        return blended(scores, *blend)

    def part_weights(self, layer: int, part: str) -> torch.Tensor:
        """(H, Nq, Nk): ``"content"`` (softmax of q · kᵀ) or ``"positional"`` part of a blended layer's weights."""
        return self.layer_weights(layer, part)

    def layer_weights(self, layer: int, part: str | None = None) -> torch.Tensor:
        """(H, Nq, Nk) float32 over the whole image: softmax(Q Kᵀ · scale + bias) in each window's block, zero
        between windows (and in the rows of tokens that are not queries at this layer). Nq · Nk per head: at
        448 px a Swin's first stage is 12544²; :meth:`window_weights` holds only the blocks."""
        lay = self.layout(layer)
        ww = self.window_weights(layer, part)  # (W, H, Tq, Tk)
        if lay.is_global:
            return ww[0]  # (H, N, N)
        full = ww.new_zeros(lay.num_heads, lay.num_tokens, lay.num_keys)  # where the capture is (CPU or GPU)
        for w, (rows, cols) in enumerate(zip(lay.windows.to(ww.device), lay.keys.to(ww.device))):
            full[:, rows[:, None], cols[None, :]] = ww[w]
        return full

    def layer_rows(self, layer: int, query: int = 0, part: str | None = None) -> torch.Tensor:
        """(H, Nk): token ``query``'s row in every head, zero outside its window. Costs O(H · Tk · d_k)."""
        lay = self._check(layer, query)
        part = self._part(layer, part)
        w, t = lay.window_of(query)
        blend = self._blend(layer)
        if blend is not None:
            positional = blend[1]
            positional = positional[min(w, positional.shape[0] - 1)][:, min(t, positional.shape[2] - 1)]  # (H, Tk)
        if part == "positional":
            row = positional.expand(lay.num_heads, -1)
        else:
            q = self.query[layer][:, w, t : t + 1]  # (H, 1, d_k)
            bias = self.bias[layer]
            if bias is not None:  # (W, H, Tq, Tk), or 1 where it is the same for every window, head or query
                bias = bias[min(w, bias.shape[0] - 1)]
                bias = bias[:, min(t, bias.shape[1] - 1)][:, None]  # (H, 1, Tk)
            row = mixed_softmax(q, self.key[layer][:, w], lay.scale, bias, self._mix(layer))[:, 0]  # (H, Tk)
            if blend is not None and part is None:
                row = blended(row, blend[0], positional)
        if lay.is_global:
            return row
        full = row.new_zeros(lay.num_heads, lay.num_keys)
        full[:, lay.keys[w].to(row.device)] = row
        return full

    def weights(self, layer: int, head: Head, part: str | None = None) -> np.ndarray:
        """The (Nq, Nk) attention matrix of one head, or its mean / max / min over heads."""
        return fuse_heads(self.layer_weights(layer, part), head).cpu().numpy()

    def row(self, layer: int, head: Head, query: int = 0, part: str | None = None) -> np.ndarray:
        """(Nk,) attention of token ``query`` over all keys; sums to 1 for a single head."""
        return fuse_heads(self.layer_rows(layer, query, part), head).cpu().numpy()

    def query_map(self, layer: int, head: Head, query: int = 0, part: str | None = None) -> np.ndarray:
        """(h, w) at the keys' grid of this layer: token ``query``'s attention to the patches, zero outside its window."""
        lay = self.layout(layer)
        return patch_grid(self.row(layer, head, query, part), lay.keys_grid, lay.num_key_prefix)

    def cls_map(self, layer: int, head: Head, part: str | None = None) -> np.ndarray:
        """(h, w): the class token's attention to the patches (prefix tokens left out).

        Raises :class:`NoClassTokenError` where the class token is not a query at ``layer`` (a model without
        one, or a CaiT's self-attention layers), rather than show token 0's row as if it were one;
        :meth:`summary_map` picks a stated alternative."""
        if not self.layout(layer).class_row:
            raise NoClassTokenError(
                "this layer has no class-token row (the model has no class token, or it does not attend here); "
                "use mean_received_map() (the attention each patch receives, averaged over the patch queries of its "
                "window) or query_map() for one patch")
        return self.query_map(layer, head, 0, part)

    def mean_received_map(self, layer: int, head: Head, part: str | None = None) -> np.ndarray:
        """(h, w) at the keys' grid: the attention each patch receives, averaged over the patch queries of its
        window (every patch query in a plain ViT): (1 / P) Σ_q A[q, patches]. Needs no class token."""
        lay = self.layout(layer)
        return mean_received(lay, fuse_heads(self.window_weights(layer, part).transpose(0, 1), head))

    def summary_kind(self, layer: int) -> Summary:
        """``"cls"`` where the class token attends at ``layer`` (its row is the summary), else ``"mean_received"``."""
        return "cls" if self.layout(layer).class_row else "mean_received"

    def summary_map(self, layer: int, head: Head, part: str | None = None) -> np.ndarray:
        """(h, w): the one-picture summary of a layer — the class token's row where the class token attends at
        ``layer``, else the mean attention each patch receives; :meth:`summary_kind` says which."""
        if self.summary_kind(layer) == "cls":
            return self.cls_map(layer, head, part)
        return self.mean_received_map(layer, head, part)

    def all_weights(self) -> np.ndarray:
        """(L, H, N, N) float32: every weight of a model whose layers share one token set and head count. Large:
        540 MB at 518 px for ViT-S."""
        if not self.same_tokens(range(self.num_layers)) or len({lay.num_heads for lay in self.layouts}) > 1:
            raise LayoutError("this model's layers differ in tokens or heads, so their weights do not stack into one "
                              "array; ask each layer for its own (layer_weights(l))")
        return np.stack([self.layer_weights(i).cpu().numpy() for i in range(self.num_layers)])

    def only(self, layer: int, head: int) -> "Capture":
        """This capture with one layer and one head kept, as its layer 0 and head 0 (what a Q/K map of many photos
        holds of each). A layer whose heads mix before the softmax has no one head to keep (:meth:`plain_softmax`)."""
        lay = self.layout(layer)
        if not 0 <= head < lay.num_heads:
            raise IndexError(f"head {head} is outside 0…{lay.num_heads - 1}")
        if not self.plain_softmax(layer):
            raise LayoutError(f"layer {layer + 1}'s heads mix before the softmax, so one head is not kept on its own")
        bias = self.bias[layer]
        if bias is not None:
            bias = (bias[:, head:head + 1] if bias.shape[1] > 1 else bias).clone()
        return dataclasses.replace(
            self, query=(self.query[layer][head:head + 1].clone(),), key=(self.key[layer][head:head + 1].clone(),),
            bias=(bias,), layouts=(dataclasses.replace(lay, stage=0, block=0, num_heads=1),), token_norms=(), mix=(),
            blend=())

    # ---- windows ----

    def window(self, layer: int, query: int = 0) -> Window:
        """The window of layer ``layer`` that holds query token ``query``: its tokens, q, k, bias and scale.

        A layer whose weights are not one softmax per head (talking heads, a gated blend) is refused in one
        sentence (:meth:`plain_softmax`): there one weight is not taken apart as q · k."""
        lay = self._check(layer, query)
        if not self.plain_softmax(layer):
            kind = "mixes its heads' logits before the softmax (talking heads)" if self._mix(layer) is not None \
                else "blends the softmax with fixed positional weights (gated positional attention)"
            raise LayoutError(f"layer {layer + 1} {kind}, so one weight is not the softmax of one q · k; "
                              "pick a layer without it")
        w, _ = lay.window_of(query)
        bias = self.bias[layer]
        if bias is not None:
            bias = bias[min(w, bias.shape[0] - 1)].expand(lay.num_heads, lay.windows.shape[1], lay.keys.shape[1])
        return Window(layer, w, lay.windows[w].cpu().numpy(), lay.keys[w].cpu().numpy(), self.query[layer][:, w],
                      self.key[layer][:, w], bias, lay.scale)

    def window_order(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(query tokens, key tokens) of ``layer`` listed window by window (window 0's rows, then window 1's,
        …; each key once): in this order a windowed layer's matrix is block-diagonal (Liu et al. 2021, Fig. 2)."""
        lay = self.layout(layer)
        keys = list(dict.fromkeys(lay.keys.reshape(-1).tolist()))  # a key shared by windows: where first seen
        return lay.windows.reshape(-1), torch.tensor(keys, dtype=torch.long)

    def ordered_weights(self, layer: int, head: Head, windows: int | None = None) -> np.ndarray:
        """(Tq · W', keys of those windows) float32: the weights of the first ``windows`` windows (every window by
        default), rows and columns in :meth:`window_order`: block-diagonal where the layer has windows. Built from
        the windows' own blocks, never from the whole-image matrix (a Swin's at 448 px is 3 × 12544²)."""
        lay = self.layout(layer)
        count = lay.num_windows if windows is None else max(1, min(int(windows), lay.num_windows))
        blocks = fuse_heads(self.window_weights(layer).transpose(0, 1)[:, :count], head).cpu().numpy()  # (W', Tq, Tk)
        keys = lay.keys[:count].cpu().numpy()  # (W', Tk)
        order = list(dict.fromkeys(keys.reshape(-1).tolist()))  # a key shared by windows: where first seen
        column = {k: i for i, k in enumerate(order)}
        tq = blocks.shape[1]
        out = np.zeros((count * tq, len(order)), np.float32)
        for w in range(count):
            out[w * tq:(w + 1) * tq, [column[k] for k in keys[w].tolist()]] = blocks[w]
        return out

    def windows_that_fit(self, layer: int, cells: int) -> int:
        """How many of layer ``layer``'s windows :meth:`ordered_weights` can hold in at most ``cells`` numbers."""
        lay = self.layout(layer)
        tq, tk = lay.windows.shape[1], lay.keys.shape[1]
        if lay.num_windows == 1 or lay.num_windows * tq * lay.num_keys <= cells:
            return lay.num_windows
        return max(1, min(lay.num_windows, int((cells / (tq * tk)) ** 0.5)))  # block-diagonal: W'·Tq × W'·Tk

    def window_mask(self, layer: int, token: int) -> np.ndarray:
        """(h, w) bool at the keys' grid: the patches query ``token`` attends within at ``layer`` (after the shift)."""
        lay = self.layout(layer)
        inside = np.zeros(lay.num_keys, bool)
        inside[lay.keys[lay.window_of(token)[0]].cpu().numpy()] = True
        return inside[lay.num_key_prefix:].reshape(lay.keys_grid)

    def __repr__(self) -> str:
        model = f"{self.prepared.model}, " if self.prepared is not None else ""
        size = f"{self.nbytes / 2**20:.1f} MB"
        if self.uniform:
            h, w = self.grid
            lay = self.layouts[0]
            return (f"Capture({model}{self.num_layers} layers × {self.num_heads} heads, N = {self.num_tokens} "
                    f"({lay.prefix} prefix + {h}×{w} patches), d_k = {lay.head_dim}, {size})")
        grids = ", ".join(f"{self.layouts[s[0]].grid[0]}×{self.layouts[s[0]].grid[1]}" for s in self.stages)
        return f"Capture({model}{self.num_layers} layers in {len(self.stages)} stages at grids {grids}, {size})"

    # ---- token norms (Darcet et al. 2024) ----

    def norm_ratio(self, layer: int) -> np.ndarray:
        """(h, w): each patch token's norm after ``layer`` divided by that layer's median patch norm."""
        lay = self.layout(layer)
        if not self.token_norms:
            raise ValueError("this capture has no token norms (it was made before attnviz recorded them)")
        h, w = lay.grid
        if layer not in self.norm_layers():
            raise LayoutError(f"the tokens after layer {layer + 1} are not its {h} × {w} grid, so their norms "
                              "are not drawn on it")
        norms = self.token_norms[layer][-h * w:].double()  # (P,): the grid's cells, after any prefix tokens
        return patch_grid((norms / norms.median()).cpu().numpy(), lay.grid, 0)

    def high_norm(self, layer: int, ratio: float = HIGH_NORM_RATIO) -> np.ndarray:
        """(h, w) bool: patches whose norm after ``layer`` exceeds ``ratio`` × the median patch norm."""
        return self.norm_ratio(layer) > ratio

    def norm_layers(self) -> list[int]:
        """The layers (0-based) whose output tokens are their grid's cells (after any prefix tokens): where
        :meth:`norm_ratio` lays the norms on the grid. Every layer of a plain ViT; none without token norms."""
        if not self.token_norms:
            return []
        found = []
        for layer, (lay, norms) in enumerate(zip(self.layouts, self.token_norms)):
            h, w = lay.grid
            if norms is not None and norms.numel() in (h * w, lay.prefix + h * w):
                found.append(layer)
        return found

    def high_norm_layers(self, ratio: float = HIGH_NORM_RATIO) -> list[int]:
        """The layers (0-based) after which at least one patch token is high-norm."""
        return [layer for layer in self.norm_layers() if self.high_norm(layer, ratio).any()]


def _check_input(model: Model, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"capture_tensor() takes a (1, 3, S, S) torch tensor, not {type(x).__name__}")
    s = model.size
    channels = len(model.data_config["mean"])  # the colour channels the model normalises (3: RGB)
    if x.ndim != 4 or x.shape[1] != channels:
        raise ValueError(
            f"capture_tensor() takes a (1, {channels}, {s}, {s}) tensor, not one of shape {tuple(x.shape)}")
    if x.shape[0] != 1:
        raise ValueError(f"capture_tensor() takes one image, not a batch of {x.shape[0]}: capture each image on its own")
    if tuple(x.shape[-2:]) != (s, s):
        raise ValueError(
            f"the input is {x.shape[-2]} × {x.shape[-1]} px but {model.name} is set up for {s} × {s} px; "
            f"load the model with size={x.shape[-1]} or prepare the photo with model.to_input(model.view(image))"
        )
    if not x.is_floating_point():
        raise TypeError(f"capture_tensor() takes a floating-point tensor, not {x.dtype}")
    weights = next(model.network.parameters()).dtype
    if x.dtype != weights:  # else a conv error 17 frames deep
        raise TypeError(f"the input is {x.dtype} but {model.name}'s weights are {weights}: pass x.to({weights})")
    if x.device.type != model.device.type:
        raise ValueError(f"the input is on {x.device} but the model is on {model.device}")
    if not (torch.isfinite(x.amax()) and torch.isfinite(x.amin())):  # NaN propagates; NaN maps otherwise
        raise ImageError("the input holds values that are not numbers (NaN or infinite), so it cannot be shown "
                         "to the model.", "not_finite", name="the input")


@torch.inference_mode()
def capture_tensor(model: Model, x: torch.Tensor, between_layers: Callable[[], None] | None = None) -> Capture:
    """Run ``model`` once on the (1, 3, S, S) tensor ``x`` and keep every layer's queries and keys.

    ``between_layers()`` is called after each block on this thread: a pause point, where a live-camera
    frame waits while a visitor's photo is captured (:meth:`attnviz.live_sharing.Priority.give_way`)."""
    _check_input(model, x)
    adapter = model.adapter
    if adapter.layouts is not None:  # the adapter lays out each layer's tokens itself (stages, windows, …)
        return _capture_layouts(model, x, between_layers)
    if model.runtime is not None:  # checked exact for this model when attnviz.fast() switched it on
        start = time.perf_counter()
        output, query, key, norms = model.runtime.forward(x)
        return Capture.of_tokens(query, key, adapter.scale, model.grid, model.num_prefix_tokens, x, output,
                                 time.perf_counter() - start, adapter.bias, adapter.has_class_token, norms,
                                 preparation(model, None))
    shape = (adapter.depth, adapter.num_heads, model.num_tokens, adapter.head_dim)  # (L, H, N, d_k)
    recorder = Recorder(
        query=torch.empty(shape, device=x.device, dtype=x.dtype),
        key=torch.empty(shape, device=x.device, dtype=x.dtype),
        norms=torch.empty((adapter.depth, model.num_tokens), device=x.device, dtype=x.dtype),  # (L, N)
        between_layers=between_layers,
    )
    start = time.perf_counter()
    with model.tap.recording(recorder):  # the hooks installed at wrap time write into this capture only
        output = adapter.forward(model.network, x)
    seconds = time.perf_counter() - start
    adapter.finish(recorder)  # e.g. rotate q and k by RoPE, as the model did inside its attention
    if len(recorder.seen) != 3 * adapter.depth:
        raise RuntimeError("the forward pass did not reach every attention layer")
    return Capture.of_tokens(recorder.query, recorder.key, adapter.scale, model.grid, model.num_prefix_tokens, x,
                             output, seconds, adapter.bias, adapter.has_class_token, recorder.norms,
                             preparation(model, None))


def _capture_layouts(model: Model, x: torch.Tensor, between_layers: Callable[[], None] | None) -> Capture:
    """:func:`capture_tensor` for an adapter with its own layouts (``adapter.layouts``): each layer's q and k
    kept per window, at that layer's grid."""
    adapter = model.adapter
    layouts = adapter.layouts
    queries = [(lay.num_heads, lay.num_windows, lay.windows.shape[1], lay.head_dim) for lay in layouts]
    keys = [(lay.num_heads, lay.num_windows, lay.keys.shape[1], lay.head_dim) for lay in layouts]
    recorder = Recorder(
        query=[torch.empty(s, device=x.device, dtype=x.dtype) for s in queries],
        key=[torch.empty(s, device=x.device, dtype=x.dtype) for s in keys],
        norms=[None] * len(layouts),  # each block's output tokens, whatever their count
        between_layers=between_layers,
    )
    start = time.perf_counter()
    with model.tap.recording(recorder):
        output = adapter.forward(model.network, x)
    seconds = time.perf_counter() - start
    adapter.finish(recorder)
    if len(recorder.seen) != 3 * adapter.depth:
        raise RuntimeError("the forward pass did not reach every attention layer")
    static = adapter.window_bias or (None,) * len(layouts)
    bias = tuple(recorder.bias.get(layer, static[layer]) for layer in range(len(layouts)))
    norms = tuple(recorder.norms)
    if all(n is None for n in norms):  # no layer's tokens read (the generic path): no norms, as in older captures
        norms = ()
    return Capture(
        query=tuple(recorder.query), key=tuple(recorder.key), bias=bias, layouts=layouts, input=x, output=output,
        seconds=seconds, token_norms=norms, prepared=preparation(model, None),
        mix=tuple(adapter.window_mix) if adapter.window_mix is not None else (),
        blend=tuple(adapter.window_blend) if adapter.window_blend is not None else (), note=adapter.unread,
    )


def capture(model: Model, image: Image.Image, fit: Fit = "crop") -> Capture:
    """Preprocess ``image`` as ``model`` expects and capture its attention (see :class:`Capture`).

    Any PIL image is first made the upright RGB picture the page and the CLI make of the same pixels
    (:func:`attnviz.images.as_rgb`), so ``capture(model, Image.open(path))`` feeds the model what
    ``capture(model, load_photo(path, model).image)`` does for any picture that is not shrunk on decoding.
    """
    if isinstance(image, (str, Path)):
        raise TypeError(f"capture() takes a PIL image, not the path {str(image)!r}: open it first, capture(model, Image.open(path))")
    if not isinstance(image, Image.Image):
        hint = " (for an array use Image.fromarray(array); for a tensor use capture_tensor)" if hasattr(image, "shape") else ""
        raise TypeError(f"capture() takes a PIL image, not {type(image).__name__}{hint}")
    if fit not in FITS:
        raise ValueError(f"fit must be one of {FITS}, not {fit!r}")
    image = as_rgb(image)  # the picture read_photo makes of the same pixels (16-bit, float, alpha, EXIF)
    cap = capture_tensor(model, model.to_input(model.view(image, fit)))
    return dataclasses.replace(cap, prepared=preparation(model, fit))
