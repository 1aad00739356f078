"""The neuron view for images (after BertViz's for text, Vig 2019): one attention weight taken apart.

For layer l, head h, query token i and key token j of a capture:

    logit_ij = (q_i ⊙ k_j) summed over the d_k dimensions · 1/√d_k + B_ij
    weight_ij = softmax over every key m of logit_im

with q and k exactly the vectors the model's softmax used (after q_norm / k_norm and, in RoPE models,
after the rotation: :class:`attnviz.Capture`), and B the additive bias of relative-position models
(0 elsewhere). Everything in float64, so the sum of the product strip is the dot product to the last
digit a page shows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .capture import Capture


@dataclass(frozen=True)
class NeuronPair:
    layer: int
    head: int
    query: int  # token index (0 = the class token in a model that has one)
    key: int
    q: np.ndarray  # (d_k,)
    k: np.ndarray  # (d_k,)
    product: np.ndarray  # (d_k,) q ⊙ k
    dot: float  # Σ product
    scale: float  # 1 / √d_k
    bias: float  # B_ij, 0.0 without a bias
    logit: float  # dot · scale + bias
    weight: float  # softmax over all N keys
    num_tokens: int


def neuron_pair(cap: Capture, layer: int, head: int, query: int, key: int) -> NeuronPair:
    """Every number between q_i, k_j and the weight A_ij of one head (0-based indices)."""
    cap._check(layer, query)
    if not 0 <= key < cap.num_tokens:
        raise IndexError(f"key token {key} is outside 0…{cap.num_tokens - 1}")
    if not 0 <= head < cap.num_heads:
        raise IndexError(f"head {head} is outside 0…{cap.num_heads - 1}")
    q = cap.query[layer, head, query].double().cpu().numpy()  # (d_k,)
    keys = cap.key[layer, head].double().cpu().numpy()  # (N, d_k)
    logits = keys @ q * cap.scale  # (N,)
    bias = 0.0
    if cap.bias is not None:
        row = cap.bias[layer, head, query].double().cpu().numpy()  # (N,)
        logits = logits + row
        bias = float(row[key])
    top = logits.max()
    log_sum = top + math.log(np.exp(logits - top).sum())
    product = q * keys[key]
    return NeuronPair(layer, head, query, key, q, keys[key].copy(), product, float(product.sum()), float(cap.scale),
                      bias, float(logits[key]), math.exp(logits[key] - log_sum), cap.num_tokens)
