"""What every adapter answers."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..errors import ModelError, RelevanceError
from .tap import Recorder, Tap, residual


@dataclass(frozen=True, eq=False)
class Adapter:
    """A network as attnviz reads it: per layer, q and k such that the attention weights are exactly
    softmax(q · kᵀ · scale + bias), and the token layout."""

    family: str
    attentions: tuple[torch.nn.Module, ...] = field(repr=False)  # one per layer, first layer first
    blocks: tuple[torch.nn.Module, ...] = field(repr=False)  # outputs: the residual stream after each layer
    num_heads: int
    head_dim: int
    scale: float
    patch: int
    embed_dim: int
    num_prefix_tokens: int
    has_class_token: bool
    bias: torch.Tensor | None = field(default=None, repr=False)  # (L, H, N, N) additive logit bias, the same for every image
    # A staged, windowed model (Swin): per layer its grid, windows, heads and scale (attnviz.stages.LayerLayout),
    # and its (W, H, T, T) logit bias (position bias + shifted-window mask); None for one token set throughout.
    layouts: tuple | None = field(default=None, repr=False)
    window_bias: tuple | None = field(default=None, repr=False)
    # Talking heads (CaiT, EfficientFormer V2): per layer an (H, H) matrix that mixes the heads' logits
    # before the bias and the softmax, or None.
    window_mix: tuple | None = field(default=None, repr=False)
    # A gated blend after the softmax (ConViT's GPSA): per layer None or (gate (H,), positional weights
    # (W, H, Tq, Tk)), fixed by the weights and the grid; the weights are
    # normalise((1 − gate) · softmax(logits) + gate · positional) (attnviz.stages.blended).
    window_blend: tuple | None = field(default=None, repr=False)
    # A block's output → the (N, D) tokens whose norms the capture keeps (channels_first for (1, C, h, w));
    # or a tuple, one such function per layer, where two layers share a block whose output holds both
    # layers' tokens (TNT's block returns its pixel and its patch tokens).
    read_tokens: Callable | tuple = field(default=residual, repr=False)

    def tokens_reader(self, layer: int) -> Callable:
        """The function that reads layer ``layer``'s tokens from its block's output."""
        return self.read_tokens[layer] if isinstance(self.read_tokens, tuple) else self.read_tokens
    # A staged family with layers that have no token-to-token map (XCiT's channel attention, VOLO's outlook
    # attention, DaViT's channel blocks), which are not read: the locale key (``stages.unread_…``) of the one
    # sentence the page shows to say why; None when every attention layer is read.
    unread: str | None = None

    @property
    def depth(self) -> int:
        return len(self.attentions)

    def grid(self, size: int) -> tuple[int, int]:
        return (size // self.patch, size // self.patch)

    def attach(self, layer: int, tap: Tap) -> None:
        """Install, once per network, the hooks that read layer ``layer``'s q and k (``tap.after``,
        ``tap.before`` with ``Recorder.put_query`` / ``put_key`` / ``put_extra``)."""
        raise NotImplementedError

    def heads_meet(self, layer: int) -> tuple[torch.nn.Module, int] | None:
        """Where layer ``layer``'s heads' outputs meet side by side (head h: channels h·d … (h + 1)·d − 1), as
        (the module they enter, the channel axis of its input), or None where they meet nowhere so simply; there
        a head is switched off (:meth:`attnviz.adapters.Tap.heads_off`). By default the attention's ``proj``, a Linear."""
        projection = getattr(self.attentions[layer], "proj", None)
        heads = self.layouts[layer].num_heads if self.layouts is not None else self.num_heads
        if isinstance(projection, torch.nn.Linear) and projection.in_features % heads == 0:
            return projection, -1
        return None

    def finish(self, recorder: Recorder) -> None:
        """Turn what the hooks read into the exact q, k (in place). Nothing to do for most families."""

    def forward(self, network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """(1, 3, S, S) → (C,): logits for a classifier, pooled features otherwise."""
        return self.forward_batch(network, x)[0]

    def forward_batch(self, network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) → (B, C): what :meth:`forward` gives, for a batch (the lesson's removal test)."""
        return network(x)

    def eager_refusal(self, network: torch.nn.Module) -> str | None:
        """Why :meth:`attention_forward` refuses ``network`` (one sentence), or None when it runs."""
        return (f"Class-specific maps need the gradient of every attention weight from an eager forward pass, which "
                f"attnviz has for plain ViTs, not yet for {self.family} ({type(network).__name__}).")

    def attention_forward(
        self, network: torch.nn.Module, x: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(B, 3, S, S) → (logits, every layer's (B, H, N, N) attention weights), computed eagerly so the
        weights stay in the autograd graph (class-specific relevance needs their gradient). Leaves
        ``network`` unchanged. A family without an eager forward refuses here (:meth:`eager_refusal`)."""
        raise RelevanceError(self.eager_refusal(network))


def check_windows(name: str, size: int, where: str, grid: tuple[int, int], window: tuple[int, int]) -> None:
    """One sentence when ``where`` ("stage 2", "block 5") of network ``name`` at ``size`` px has a token ``grid``
    that does not divide into its ``window``s: the model would pad it with tokens that are not in the photo."""
    if grid[0] % window[0] or grid[1] % window[1]:
        raise ModelError(
            f"At {size} px, {where} of {name} has a {grid[0]} × {grid[1]} token grid that does not divide into "
            f"{window[0]} × {window[1]} windows, so the model pads it with tokens that are not in the photo; attnviz "
            "refuses that size rather than show them (use a size where every stage divides).")


def check_square_size(name: str, patch: int, size: int, built: tuple[int, int] | None, dynamic: bool) -> None:
    """One sentence when ``size`` is not an input this network can take exactly."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ModelError(f"The input size must be a positive whole number of pixels, not {size!r}.")
    if size % patch:
        raise ModelError(f"The input size must be a multiple of {name}'s {patch} px patches; {size} px is not.")
    if built is not None and built[0] != built[1]:
        raise ModelError(
            f"{name} was built for {built[0]} × {built[1]} px inputs; attnviz needs a square input "
            "(build it with a square img_size)."
        )
    if built is not None and built[0] != size and not dynamic:
        raise ModelError(
            f"{name} was built for {built[0]} px inputs, not {size} px; build it with img_size={size} "
            "(or dynamic_img_size=True)."
        )
