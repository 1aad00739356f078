"""What every adapter answers, and the recorder its hooks write into."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ModelError


class Recorder:
    """Where an adapter's hooks put one forward pass's queries and keys.

    The model object is shared by every browser session, so only the thread that started the
    capture is recorded; other threads running the same model at the same moment are ignored.
    """

    def __init__(self, query: torch.Tensor, key: torch.Tensor, norms: torch.Tensor) -> None:
        self.owner = threading.get_ident()
        self.query = query  # (L, H, N, d_k)
        self.key = key  # (L, H, N, d_k)
        self.norms = norms  # (L, N)
        self.extras: dict[int, Any] = {}  # per layer: what an adapter needs after the pass (e.g. RoPE)
        self.seen: set[tuple[str, int]] = set()

    def mine(self) -> bool:
        return threading.get_ident() == self.owner

    def put_query(self, layer: int, q: torch.Tensor) -> None:
        """``q``: (H, N, d_k) of the one image in the batch."""
        if self.mine():
            self.query[layer].copy_(q)  # copied out of the fused qkv buffer
            self.seen.add(("q", layer))

    def put_key(self, layer: int, k: torch.Tensor) -> None:
        if self.mine():
            self.key[layer].copy_(k)
            self.seen.add(("k", layer))

    def put_extra(self, layer: int, value: Any) -> None:
        if self.mine():
            self.extras[layer] = value

    def put_tokens(self, layer: int, tokens: torch.Tensor) -> None:
        """``tokens``: (N, D) residual stream after block ``layer``; keeps only each token's L2 norm."""
        if self.mine():
            self.norms[layer].copy_(tokens.norm(dim=-1))
            self.seen.add(("x", layer))


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

    @property
    def depth(self) -> int:
        return len(self.attentions)

    def grid(self, size: int) -> tuple[int, int]:
        return (size // self.patch, size // self.patch)

    def attach(self, layer: int, recorder: Recorder) -> list:
        """Register the hooks that read layer ``layer``'s q and k; returns their handles."""
        raise NotImplementedError

    def finish(self, recorder: Recorder) -> None:
        """Turn what the hooks read into the exact q, k (in place). Nothing to do for most families."""

    def blocks_output(self, output: Any) -> torch.Tensor:
        """A block's forward output → the (B, N, D) residual stream."""
        return output[0] if isinstance(output, tuple) else output

    def forward(self, network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """(1, 3, S, S) → (C,): logits for a classifier, pooled features otherwise."""
        return self.forward_batch(network, x)[0]

    def forward_batch(self, network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) → (B, C): what :meth:`forward` gives, for a batch (the lesson's removal test)."""
        return network(x)


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
