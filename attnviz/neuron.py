"""The neuron view for images (after BertViz's for text, Vig 2019): one attention weight taken apart.

For layer l, head h, query token i and key token j of a capture:

    logit_ij = (q_i ⊙ k_j) summed over the d_k dimensions · 1/√d_k + B_ij
    weight_ij = softmax over every key m of logit_im

with q and k exactly the vectors the model's softmax used (after q_norm / k_norm and, in RoPE models,
after the rotation: :class:`attnviz.Capture`), and B the additive bias of relative-position models
(0 elsewhere). In a windowed layer (Swin) the softmax runs over the query's window only, so the key
must lie in it. Everything in float64, so the sum of the product strip is the dot product to the last
digit a page shows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .capture import Capture, Window
from .errors import LayoutError


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
    num_tokens: int  # the keys the softmax runs over: N, or the window's


def window_pair(cap: Capture, layer: int, head: int, query: int, key: int) -> tuple[Window, int, int]:
    """(the window holding query token ``query`` at ``layer``, its row, ``key``'s column in it): a weight is the
    softmax of one q · k only between a query and a key of the same window."""
    lay = cap.layout(layer)
    if not 0 <= key < lay.num_keys:
        raise IndexError(f"key token {key} is outside 0…{lay.num_keys - 1}")
    if not 0 <= head < lay.num_heads:
        raise IndexError(f"head {head} is outside 0…{lay.num_heads - 1}")
    window = cap.window(layer, query)
    column = np.flatnonzero(window.keys == key)
    if not len(column):
        raise LayoutError(f"at layer {layer + 1} token {query} attends only inside its window of {len(window.keys)} "
                          f"tokens, which does not hold token {key}: their weight is 0; pick a key inside the window")
    return window, window.row(query), int(column[0])


def neuron_pair(cap: Capture, layer: int, head: int, query: int, key: int) -> NeuronPair:
    """Every number between q_i, k_j and the weight A_ij of one head (0-based indices), inside the window that
    holds query ``query`` (every token, in a plain ViT)."""
    window, i, j = window_pair(cap, layer, head, query, key)
    q = window.query[head, i].double().cpu().numpy()  # (d_k,)
    k = window.key[head, j].double().cpu().numpy()
    logits = window.logits(head)[i]  # (Tk,): over the window's keys
    bias = 0.0 if window.bias is None else float(window.bias[head, i, j])
    top = logits.max()
    log_sum = top + math.log(np.exp(logits - top).sum())
    product = q * k
    return NeuronPair(layer, head, query, key, q, k, product, float(product.sum()), float(window.scale),
                      bias, float(logits[j]), math.exp(logits[j] - log_sum), len(window.keys))
