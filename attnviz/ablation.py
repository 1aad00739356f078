"""Causal head ablation: switch a head off and see whether the output cares.

Head h of layer l is switched off by zeroing its slice of the attention output, softmax(q kᵀ · scale) v
for that head, before the output projection (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really
Better than One?"; the zero ablation ViT-Prisma offers). The output followed is the one of
:mod:`attnviz.faithfulness`: the effect of a head is 1 − cos(f, f₀) of the output features for a
backbone, and the drop in the probability of the originally predicted class for a classifier.

The whole L × H grid reuses what does not change: the blocks before layer l see the untouched photo,
so their output is computed once and every ablated run starts at layer l. The runs advance together
(one batch that grows by H rows at each layer), H · L (L + 1) / 2 block passes in all, about half of
L · H full forward passes. Beside each head's effect stand two attention statistics, so that "does a
head that attends to the object matter?" is a rank correlation on this photo.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Literal

import numpy as np
import torch

import attnviz.interventions as interventions
from .capture import Capture, capture_tensor
from .errors import FaithfulnessError
from .faithfulness import Measure, follow, measure_of
from .models import Model
from .rollout import rollout_map, rollout_refusal
from .softmax import on_grid
from .stages import mean_received
from .stats import entropy as entropy_nats

TOP_SHARE = 0.1  # "the object": the top 10 % of patches by rollout
TENDENCY_RHO = 0.3  # |Spearman ρ| from which a tendency is stated (p ≈ 0.01 over 72 heads)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties get their mean rank); NaN when either side is constant."""
    def ranks(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64).ravel()
        order = np.argsort(v, kind="stable")
        r = np.empty(v.size)
        r[order] = np.arange(v.size, dtype=np.float64)
        for value in np.unique(v):  # ties: their mean rank
            same = v == value
            r[same] = r[same].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass(frozen=True)
class HeadAblation:
    """Every head's effect on the output when switched off alone, next to its attention statistics."""

    measure: Measure
    effect: np.ndarray  # (L, H): 1 − cosine similarity, or the drop of the predicted class's probability
    entropy: np.ndarray  # (L, H): entropy in nats of the head's class-token attention over the patches
    top_share: np.ndarray  # (L, H): share of that attention on the rollout's top 10 % patches
    target: int | None = None
    target_label: str | None = None
    base_probability: float | None = None

    @property
    def entropy_correlation(self) -> float:
        return _spearman_finite(self.effect, self.entropy)

    @property
    def share_correlation(self) -> float:
        return _spearman_finite(self.effect, self.top_share)

    def tendency(self, statistic: Literal["entropy", "share"]) -> Literal["more", "less", "little", "none"]:
        """What the rank correlation says of heads that attend narrowly (low entropy) or to the object (high
        share): they tend to matter ``"more"`` or ``"less"`` (|ρ| ≥ ``TENDENCY_RHO``), ``"little"`` is said
        (|ρ| below it), or ``"none"`` can be (a constant side)."""
        rho = self.entropy_correlation if statistic == "entropy" else self.share_correlation
        if np.isnan(rho):
            return "none"
        if abs(rho) < TENDENCY_RHO:
            return "little"
        toward = -rho if statistic == "entropy" else rho  # low entropy = narrow
        return "more" if toward > 0 else "less"

    def to_json(self) -> list[list[float]]:
        """One list per layer (layer 1 first), one effect per head (head 1 first; a layer's own heads only)."""
        return per_layer(self.effect)


def per_layer(values: np.ndarray) -> list[list[float]]:
    """(L, H) with NaN where a layer lacks a head → one list per layer of its own heads' values (for JSON)."""
    return [[float(v) for v in row if np.isfinite(v)] for row in values]


def switch_refusal(model: Model) -> str | None:
    """Why heads of ``model`` cannot be switched off (one sentence), or None: every layer's attention must join its
    heads' outputs side by side in one linear output projection (the hook :meth:`attnviz.adapters.Tap.heads_off`
    zeroes a head's slice there)."""
    if interventions.refusal(model) is None or len(model.tap.switched) == model.depth:
        return None
    return (f"{model.public_name} ({model.adapter.family}) does not pass each head's output into one projection, side "
            "by side with the other heads' and nowhere else, at every layer, so attnviz cannot switch one head off there.")


def _spearman_finite(a: np.ndarray, b: np.ndarray) -> float:
    """:func:`spearman` over the heads both arrays have (a layer with fewer heads: NaN in the others)."""
    kept = np.isfinite(a) & np.isfinite(b)
    return spearman(a[kept], b[kept])


def head_statistics(cap: Capture) -> tuple[np.ndarray, np.ndarray]:
    """(L, H) entropy in nats (as in the statistics view) of each head's class-token row over the patches
    (renormalised), and (L, H) share of that row on the rollout's top 10 % patches. Without a class token:
    the mean attention each patch receives, per head. A model with stages: each layer's maps at its own grid, the
    share measured on the photo's patches (a coarser cell's weight spread over the patches under it); a layer with
    fewer heads than the most any layer has: NaN in the others."""
    grid = cap.grid  # the photo's patches: the first layer's grid
    if rollout_refusal(cap) is None:
        rolled = rollout_map(cap)
    else:  # no token set to roll out over at the last layers (pooled keys): the last layer's own map
        rolled = cap.summary_map(cap.num_layers - 1, "mean")
    rolled = torch.from_numpy(np.ascontiguousarray(on_grid(rolled, grid))).double().reshape(-1)
    top = np.argsort(-rolled.numpy(), kind="stable")[: max(1, int(round(TOP_SHARE * rolled.numel())))]
    entropy = np.full((cap.num_layers, cap.num_heads), np.nan)
    share = np.full_like(entropy, np.nan)
    for layer in range(cap.num_layers):
        lay = cap.layout(layer)
        if cap.summary_kind(layer) == "cls":
            rows = cap.layer_rows(layer, 0)[:, lay.num_key_prefix:].double()  # (H, P)
        else:  # the mean attention each patch receives from the patch queries of its window
            weights = cap.window_weights(layer).transpose(0, 1)  # (H, W, Tq, Tk)
            rows = torch.stack([torch.from_numpy(mean_received(lay, weights[h])).reshape(-1)
                                for h in range(lay.num_heads)]).double()
        rows = (rows / rows.sum(-1, keepdim=True)).cpu()
        heads = rows.shape[0]
        entropy[layer, :heads] = entropy_nats(rows).numpy()
        fine = on_grid(rows.reshape(heads, *lay.keys_grid), grid).reshape(heads, -1)
        share[layer, :heads] = (fine[:, top].sum(-1) / fine.sum(-1)).numpy()
    return entropy, share


@torch.inference_mode()
def head_ablation(model: Model, cap: Capture, progress: Callable[[float], None] | None = None) -> HeadAblation:
    """Switch off each of the L × H heads alone on ``cap``'s photo; ``progress(fraction)`` after each layer
    (raising from it stops the run)."""
    if interventions.refusal(model) is not None:  # not a plain timm ViT: one forward pass per head switched off
        return _switched_ablation(model, cap, progress)
    network = model.network
    depth, heads = len(network.blocks), network.blocks[0].attn.num_heads
    stream = interventions.embed(network, cap.input)  # (1, N, D)
    before = []  # the residual stream entering each layer, untouched photo
    for block in network.blocks:
        before.append(stream)
        stream = interventions.block_forward(block, stream)
    base = interventions.readout(network, stream)[0]  # (C,)

    running = stream.new_empty((0, *stream.shape[1:]))  # (B, N, D): the ablated runs so far
    total, done = depth * (depth + 1) / 2, 0
    with interventions.per_core("attnviz-ablation") as (pool, workers):  # each layer's rows split across the cores
        for layer, block in enumerate(network.blocks):
            fresh = before[layer].expand(heads, -1, -1)  # one new run per head of this layer
            on = torch.ones(running.shape[0] + heads, heads)
            on[running.shape[0] + torch.arange(heads), torch.arange(heads)] = 0.0  # row of head h: h off
            first = 1 if layer == depth - 1 and interventions.reads_class_token(network) else None  # all readout reads
            x = torch.cat([running, fresh])

            @torch.inference_mode()  # per thread: the pool's threads do not inherit it
            def run(rows: torch.Tensor, block=block, x=x, on=on, first=first) -> torch.Tensor:
                return interventions.block_forward(block, x[rows], on[rows], first=first)

            parts = [rows for rows in torch.arange(x.shape[0]).tensor_split(workers) if rows.numel()]
            running = torch.cat(list(pool.map(run, parts)))
            done += layer + 1
            if progress is not None:
                progress(done / total)
    out = interventions.readout(network, running)  # (L · H, C): layer-major
    measure = measure_of(model)
    target = int(base.argmax()) if measure == "probability" else None
    kept = follow(out.float(), base.float(), measure, target)  # (L · H,)
    if measure == "probability":
        p0 = float(follow(base[None].float(), base.float(), measure, target)[0])
        effect = p0 - kept
    else:
        p0, effect = None, 1.0 - kept
    entropy, share = head_statistics(cap)
    return HeadAblation(
        measure=measure, effect=effect.reshape(depth, heads), entropy=entropy, top_share=share, target=target,
        target_label=None if target is None else model.labels[target], base_probability=p0,
    )


def _heads_on(network, off: Iterable[tuple[int, int]]) -> list[torch.Tensor]:
    depth, heads = len(network.blocks), network.blocks[0].attn.num_heads
    on = [torch.ones(1, heads) for _ in range(depth)]
    for layer, head in off:
        if not (0 <= layer < depth and 0 <= head < heads):
            raise IndexError(f"head ({layer}, {head}) is outside {depth} layers × {heads} heads (0-based)")
        on[layer][0, head] = 0.0
    return on


@torch.inference_mode()
def ablated_capture(model: Model, cap: Capture, off: Iterable[tuple[int, int]]) -> Capture:
    """``cap``'s photo re-run with the heads ``off`` ((layer, head), 0-based) switched off together: a
    Capture of the ablated network (its q, k, output and token norms), so every map can be redrawn."""
    off = tuple(off)
    if interventions.refusal(model) is not None:  # any other model: its own capture, with the heads switched off
        if (why := switch_refusal(model)) is not None:
            raise FaithfulnessError(why)
        for layer, head in off:
            if not (0 <= layer < cap.num_layers and 0 <= head < cap.heads(layer)):
                raise IndexError(f"head ({layer}, {head}) is not one of this model's heads (0-based)")
        chosen: dict[int, list[int]] = {}
        for layer, head in off:
            chosen.setdefault(layer, []).append(head)
        with model.tap.heads_off(chosen):
            ablated = capture_tensor(model, cap.input)
        return replace(ablated, prepared=cap.prepared)
    network = model.network
    on = _heads_on(network, off)
    x = interventions.embed(network, cap.input)  # (1, N, D)
    record: list = []
    norms = []
    for layer, block in enumerate(network.blocks):
        x = interventions.block_forward(block, x, on[layer], record)
        norms.append(x[0].norm(dim=-1))  # (N,)
    output = interventions.readout(network, x)[0]
    dtype = cap.query[0].dtype
    return replace(cap, query=tuple(q[0, :, None].to(dtype) for q, _ in record),  # (H, 1, N, d_k) per layer
                   key=tuple(k[0, :, None].to(dtype) for _, k in record), output=output,
                   token_norms=tuple(n.to(dtype) for n in norms))


@torch.inference_mode()
def _switched_ablation(model: Model, cap: Capture, progress: Callable[[float], None] | None) -> HeadAblation:
    """:func:`head_ablation` for any model whose heads :meth:`attnviz.adapters.Tap.heads_off` can switch off: each
    head of each layer off alone, a whole forward pass each (Σ_l H_l passes)."""
    if (why := switch_refusal(model)) is not None:
        raise FaithfulnessError(why)
    network, x = model.network, cap.input
    base = model.adapter.forward(network, x)
    measure = measure_of(model)
    target = int(base.argmax()) if measure == "probability" else None
    effect = np.full((cap.num_layers, cap.num_heads), np.nan)
    p0 = float(follow(base[None].float(), base.float(), measure, target)[0]) if measure == "probability" else None
    for layer in range(cap.num_layers):
        outputs = []
        for head in range(cap.heads(layer)):
            with model.tap.heads_off({layer: (head,)}):
                outputs.append(model.adapter.forward(network, x))
        kept = follow(torch.stack(outputs).float(), base.float(), measure, target)  # (H_l,)
        effect[layer, :len(kept)] = p0 - kept if measure == "probability" else 1.0 - kept
        if progress is not None:
            progress((layer + 1) / cap.num_layers)
    entropy, share = head_statistics(cap)
    return HeadAblation(
        measure=measure, effect=effect, entropy=entropy, top_share=share, target=target,
        target_label=None if target is None else model.labels[target], base_probability=p0,
    )


def ablated_outputs(model: Model, cap: Capture, off: Iterable[tuple[int, int]]) -> torch.Tensor:
    """(C,): the output with the heads ``off`` switched off together."""
    return ablated_capture(model, cap, off).output
