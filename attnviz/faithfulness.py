"""Does a map point at what the model relies on? Deletion and insertion curves for every map, on one photo.

Rank the patches by a map, then (Petsiuk, Das & Saenko 2018, "RISE", §4.1; Chefer, Gur & Wolf 2021,
"Transformer Interpretability Beyond Attention Visualization", §4.3 "positive / negative perturbation"):

- **deletion**: remove the top-ranked patches first, 0 %, 10 %, …, 100 % of them, and follow the output;
- **insertion**: start with every patch removed and put the top-ranked patches back first.

The output followed is the probability of the originally predicted class for a classifier, and the
cosine similarity of the output features to the untouched photo's for a backbone. A curve's area is
its mean over the steps by the trapezoid rule: a low deletion area and a high insertion area mean
the map ranks first the patches the output depends on. Random orders (mean ± standard deviation of
their areas) say what "no better than chance" looks like on this photo.

"Removed" is one of three fills: ``"token"`` drops the patch token from the sequence (the prefix
tokens and the kept patches' own position embeddings stay, :mod:`attnviz.interventions`), so no
out-of-distribution pixels reach the model; ``"mean"`` (the photo's mean colour) and ``"blur"`` are
the lesson's pixel fills (:func:`attnviz.lesson.fill_image`). Every input of every curve is one
forward pass; identical inputs (the untouched photo, the empty one) are computed once, and the rest
run in batches.
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F

import attnviz.i18n as i18n
import attnviz.interventions as interventions
from .capture import Capture, Head
from .softmax import on_grid
from .errors import FaithfulnessError, RelevanceError
from .lesson import fill_image, remove_patches
from .models import Model
from .rollout import rollout_map, rollout_refusal

Fill = Literal["token", "mean", "blur"]
FILLS: tuple[Fill, ...] = ("token", "mean", "blur")
Measure = Literal["probability", "cosine"]
Kind = Literal["attention", "rollout", "relevance", "norm", "random"]
STEPS = 10  # 10 % of the patches per step
RANDOM_ORDERS = 5
BATCH = 32  # inputs per forward pass


@dataclass(frozen=True)
class Ranking:
    """One map's order of the patches, most important first (raster indices on the patch grid)."""

    name: str  # in English, as in the JSON: "attention, layer 12, mean of heads"
    kind: Kind
    order: np.ndarray  # (P,) int
    layer: int | None = None  # 0-based, for attention and norm maps
    head: Head | None = None  # 0-based head, or "mean", for attention maps
    label: str | None = None  # the class a relevance map explains


def rank(grid_map: np.ndarray, grid: tuple[int, int] | None = None) -> np.ndarray:
    """(h, w) map → (P,) patch indices, largest value first; ties by raster order. With ``grid`` (the patches
    removed, the photo's), a map on a coarser grid (a later stage's) first gives each patch the value of the
    map's cell that covers it."""
    grid_map = np.asarray(grid_map, dtype=np.float64)
    if grid is not None:
        grid_map = on_grid(grid_map, grid)
    return np.argsort(-grid_map.ravel(), kind="stable")


def attention_name(cap: Capture, layer: int, head: Head) -> str:
    what = "attention" if cap.summary_kind(layer) == "cls" else "mean attention received"
    return f"{what}, layer {layer + 1}, " + ("mean of heads" if head == "mean" else f"head {int(head) + 1}")


def standard_rankings(
    model: Model, cap: Capture, *, heads: bool = False, random_orders: int = RANDOM_ORDERS, seed: int = 0
) -> tuple[tuple[Ranking, ...], tuple[str, ...]]:
    """Every map the page can draw, ranked: the class token's attention of each layer (head mean; each
    head too with ``heads``), rollout, class-specific relevance (classifiers), the last layer's token
    norms, and ``random_orders`` random orders. Also the sentences for maps not available here."""
    rankings, notes = [], []
    grid = model.grid  # the patches removed (outputs()): the photo's
    for layer in range(cap.num_layers):
        for head in ("mean", *(range(cap.heads(layer)) if heads else ())):
            rankings.append(Ranking(attention_name(cap, layer, head), "attention",
                                    rank(cap.summary_map(layer, head), grid), layer, head))
    if (why := rollout_refusal(cap)) is None:
        rankings.append(Ranking("attention rollout", "rollout", rank(rollout_map(cap), grid)))
    else:
        notes.append(why)
    if model.labels is not None:
        from .relevance import relevance_map

        target = int(cap.output.argmax())
        try:
            relevance = relevance_map(model, cap, target)
            rankings.append(Ranking(f"class-specific relevance ({model.labels[target]})", "relevance", rank(relevance),
                                    label=model.labels[target]))
        except RelevanceError as error:
            notes.append(str(error))
    if (last := norm_layer(cap)) is not None:  # ranked by norm / median: the same order as by norm
        rankings.append(Ranking(f"token norm after layer {last + 1}", "norm", rank(cap.norm_ratio(last), grid), last))
    rng = np.random.default_rng(seed)
    patches = grid[0] * grid[1]
    for i in range(random_orders):
        rankings.append(Ranking(f"random order {i + 1}", "random", rng.permutation(patches)))
    return tuple(rankings), tuple(notes)


def map_count(model: Model, cap: Capture, *, heads: bool = False, random_orders: int = RANDOM_ORDERS) -> int:
    """How many rankings :func:`standard_rankings` gives, without computing them (relevance costs a backward
    pass): what the page says before the button is pressed."""
    attention = sum(1 + (cap.heads(layer) if heads else 0) for layer in range(cap.num_layers))
    # what relevance_map and class_relevance refuse before any computing (the target class is always in range)
    relevance = (model.labels is not None and cap.has_class_token
                 and model.adapter.eager_refusal(model.network) is None)
    rollout = rollout_refusal(cap) is None
    return attention + rollout + relevance + (norm_layer(cap) is not None) + random_orders


def norm_layer(cap: Capture) -> int | None:
    """The last layer, where its output tokens lie on its grid (their norms rank the patches), or None."""
    return cap.num_layers - 1 if cap.num_layers - 1 in cap.norm_layers() else None


def planned_inputs(maps: int, steps: int = STEPS) -> int:
    """Forward passes for ``maps`` rankings at most: the untouched and the empty photo once, and per map the
    deletion and insertion steps between them (identical patch sets run once, so a run may need fewer)."""
    return 2 + 2 * (steps - 1) * maps


def area(values: np.ndarray) -> float:
    """Mean of a curve over equal steps, by the trapezoid rule."""
    v = np.asarray(values, dtype=np.float64)
    return float((v[:-1] + v[1:]).sum() / 2 / (v.shape[0] - 1))


@dataclass(frozen=True)
class Curve:
    """Deletion and insertion curve of one ranking."""

    ranking: Ranking
    deletion: np.ndarray  # (steps + 1,) output measure after removing the first removed[i] patches
    insertion: np.ndarray  # (steps + 1,) output measure with only the first removed[i] patches kept

    @property
    def name(self) -> str:
        return self.ranking.name

    @property
    def deletion_area(self) -> float:
        return area(self.deletion)

    @property
    def insertion_area(self) -> float:
        return area(self.insertion)


Verdict = Literal["better", "random", "worse"]


@dataclass(frozen=True)
class Faithfulness:
    """Every map's deletion and insertion curves on one photo, and the random orders beside them."""

    fill: Fill
    measure: Measure
    removed: np.ndarray  # (steps + 1,) patches removed (deletion) / put back (insertion) at each step
    num_patches: int
    curves: tuple[Curve, ...]  # the maps, in the order they were asked for
    random: tuple[Curve, ...]  # the random orders
    target: int | None = None  # the class followed (classifiers)
    target_label: str | None = None
    base_probability: float | None = None  # its probability on the untouched photo
    notes: tuple[str, ...] = field(default=())  # maps not available for this model, one sentence each
    inputs: int = 0  # distinct inputs run (one forward pass each, in batches)

    def _spread(self, which: str) -> tuple[float, float]:
        areas = np.array([getattr(c, f"{which}_area") for c in self.random])
        return float(areas.mean()), float(areas.std(ddof=1)) if areas.size > 1 else 0.0

    @property
    def random_deletion(self) -> tuple[float, float]:
        """Mean and standard deviation of the random orders' deletion areas."""
        return self._spread("deletion")

    @property
    def random_insertion(self) -> tuple[float, float]:
        return self._spread("insertion")

    def verdict(self, curve: Curve, which: Literal["deletion", "insertion"] = "deletion") -> Verdict:
        """"better" than random when the area is beyond the random mean by more than their spread in the
        good direction (lower deletion, higher insertion), "worse" beyond it the other way, else "random"."""
        mean, spread = self._spread(which)
        gain = (mean - getattr(curve, f"{which}_area")) * (1 if which == "deletion" else -1)
        return "better" if gain > spread else "worse" if gain < -spread else "random"

    def ranked(self) -> tuple[Curve, ...]:
        """The maps from the lowest deletion area (best) to the highest; ties by higher insertion area."""
        return tuple(sorted(self.curves, key=lambda c: (c.deletion_area, -c.insertion_area)))

    def curve(self, name: str) -> Curve:
        for c in (*self.curves, *self.random):
            if c.name == name:
                return c
        raise KeyError(f"no map called {name!r}; the maps are {[c.name for c in self.curves]}")

    def to_json(self) -> dict:
        """The layout of ``attnviz faithfulness --json``: fill, measure, and per map its order, steps,
        both curves and both areas (random orders included, named "random order i")."""
        return {
            "fill": self.fill, "measure": self.measure, "num_patches": self.num_patches,
            "target": self.target, "target_label": self.target_label, "base_probability": self.base_probability,
            "maps": [{
                "name": c.name, "order": c.ranking.order.tolist(), "removed": self.removed.tolist(),
                "deletion": c.deletion.tolist(), "insertion": c.insertion.tolist(),
                "deletion_area": c.deletion_area, "insertion_area": c.insertion_area,
            } for c in (*self.curves, *self.random)],
            "random_deletion_area": dict(zip(("mean", "std"), self.random_deletion)),
            "random_insertion_area": dict(zip(("mean", "std"), self.random_insertion)),
            "notes": list(self.notes),
        }


# ---- running the inputs ------------------------------------------------------------------------

def check_fill(model: Model, fill: str) -> None:
    """A :class:`FaithfulnessError` when ``fill`` cannot run on ``model``."""
    if fill not in FILLS:
        raise FaithfulnessError(f"The fill must be one of {', '.join(FILLS)}, not {fill!r}.")
    if fill != "token":
        return
    reason = interventions.refusal(model)
    if reason is not None:
        raise FaithfulnessError(reason)
    if model.network.global_pool != "token":
        raise FaithfulnessError(
            f"{model.public_name} averages its patch tokens into its output, so with every patch token removed there "
            "is no output to follow; use the mean-colour or blur fill.")


def measure_of(model: Model) -> Measure:
    return "cosine" if model.labels is None else "probability"


def follow(out: torch.Tensor, base: torch.Tensor, measure: Measure, target: int | None) -> np.ndarray:
    """(B, C) outputs → (B,): the probability of ``target``, or the cosine similarity to ``base`` (C,)."""
    out = out.double()
    if measure == "probability":
        return out.softmax(-1)[:, target].cpu().numpy()
    return F.cosine_similarity(out, base.double()[None].expand_as(out), dim=-1).cpu().numpy()


@torch.inference_mode()
def outputs(model: Model, x: torch.Tensor, removed: np.ndarray, fill: Fill, batch: int = BATCH,
            progress: Callable[[int], None] | None = None) -> torch.Tensor:
    """(M, C): the model's output on the (1, 3, S, S) input ``x`` with, per row of the (M, P) bool
    array ``removed``, those patches removed by ``fill``. ``progress(n)`` after each batch of n inputs."""
    grid, patch = model.grid, model.patch
    results: list[torch.Tensor | None] = [None] * removed.shape[0]
    if fill == "token":
        network, prefix = model.network, model.num_prefix_tokens
        tokens = interventions.embed(network, x)  # (1, N, D): embedded once, then patches dropped
        runtime = model.runtime if model.runtime is not None and model.runtime.removal() is not None else None
        kept_count = (~removed).sum(1)
        chunks = [rows[start:start + batch]  # rows of one length form a batch; the longest first
                  for count in np.unique(kept_count)[::-1] for rows in [np.flatnonzero(kept_count == count)]
                  for start in range(0, rows.size, batch)]

        @torch.inference_mode()  # per thread: the pool's threads do not inherit it
        def run(chunk: np.ndarray) -> torch.Tensor:
            kept = torch.as_tensor(np.stack([np.flatnonzero(~removed[r]) for r in chunk]))  # (b, k)
            t = interventions.keep_tokens(tokens.expand(chunk.size, -1, -1), prefix, kept)
            if runtime is not None:  # the same blocks and head, checked exact against PyTorch on first use
                return runtime.blocks_output(t)  # (b, C)
            return interventions.readout(network, interventions.run_blocks(network, t, for_readout=True))
    else:
        filled = fill_image(x, fill, patch)
        chunks = np.array_split(np.arange(removed.shape[0]), range(batch, removed.shape[0], batch))

        @torch.inference_mode()
        def run(chunk: np.ndarray) -> torch.Tensor:
            xs = torch.cat([remove_patches(x, np.flatnonzero(removed[r]), grid, patch, filled) for r in chunk])
            return model.adapter.forward_batch(model.network, xs)  # (b, C)

    # As many batches at once as the cores hold, one thread each (the runtime's calls release the GIL too).
    with interventions.per_core("attnviz-removal") as (pool, workers):
        waiting, running = iter(chunks), {}

        def submit() -> None:
            chunk = next(waiting, None)
            if chunk is not None:
                running[pool.submit(run, chunk)] = chunk

        for _ in range(workers):
            submit()
        while running:  # at most `workers` batches in flight: a cancel waits for those alone
            for future in wait(running, return_when=FIRST_COMPLETED).done:
                chunk = running.pop(future)
                submit()
                for r, o in zip(chunk, future.result()):
                    results[r] = o
                if progress is not None:
                    progress(chunk.size)  # may raise (the page's cancel): no other batch starts
    return torch.stack(results).float()  # (M, C)


def steps_removed(num_patches: int, steps: int = STEPS) -> np.ndarray:
    """(steps + 1,) patches removed at each step: ⌊P · i / steps⌋, from 0 to P."""
    return (num_patches * np.arange(steps + 1)) // steps


def faithfulness(
    model: Model,
    cap: Capture,
    rankings: Sequence[Ranking] | None = None,
    *,
    fill: Fill = "token",
    steps: int = STEPS,
    heads: bool = False,
    random_orders: int = RANDOM_ORDERS,
    seed: int = 0,
    batch: int = BATCH,
    progress: Callable[[float], None] | None = None,
) -> Faithfulness:
    """Deletion and insertion curves of ``rankings`` (default: :func:`standard_rankings`) on ``cap``'s photo.

    ``progress(fraction)`` is called after each batch; raising from it stops the run (the page's cancel).
    """
    check_fill(model, fill)
    if not 1 <= steps <= 100:
        raise ValueError(f"steps must be 1…100, not {steps}")
    notes: tuple[str, ...] = ()
    if rankings is None:
        rankings, notes = standard_rankings(model, cap, heads=heads, random_orders=random_orders, seed=seed)
    num_patches = model.grid[0] * model.grid[1]  # what outputs() removes: the photo's patches
    removed = steps_removed(num_patches, steps)

    # Every input as the set of patches it removes; identical sets are run once.
    keys: dict[bytes, int] = {}
    masks: list[np.ndarray] = []
    plan = []  # per ranking: (deletion rows, insertion rows) into masks
    for ranking in rankings:
        rows = ([], [])
        for n in removed:
            for which, gone in enumerate((ranking.order[:n], ranking.order[n:])):
                mask = np.zeros(num_patches, dtype=bool)
                mask[gone] = True
                key = np.packbits(mask).tobytes()
                if key not in keys:
                    keys[key] = len(masks)
                    masks.append(mask)
                rows[which].append(keys[key])
        plan.append(rows)
    untouched = keys.setdefault(np.packbits(np.zeros(num_patches, dtype=bool)).tobytes(), len(masks))
    if untouched == len(masks):
        masks.append(np.zeros(num_patches, dtype=bool))

    done = [0]

    def advance(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0] / len(masks))

    out = outputs(model, cap.input, np.stack(masks), fill, batch, advance)  # (M, C)
    measure = measure_of(model)
    base = out[untouched]
    target = int(base.argmax()) if measure == "probability" else None
    values = follow(out, base, measure, target)  # (M,)

    curves = [Curve(r, values[np.array(d)], values[np.array(i)]) for r, (d, i) in zip(rankings, plan)]
    return Faithfulness(
        fill=fill, measure=measure, removed=removed, num_patches=num_patches,
        curves=tuple(c for c in curves if c.ranking.kind != "random"),
        random=tuple(c for c in curves if c.ranking.kind == "random"),
        target=target, target_label=None if target is None else model.labels[target],
        base_probability=None if target is None else float(values[untouched]), notes=notes, inputs=len(masks),
    )


# ---- words -------------------------------------------------------------------------------------

def map_name(ranking: Ranking, lang: str = "en") -> str:
    """The ranking's name in ``lang`` (layers and heads counted from 1, as on the page)."""
    key = f"faithfulness.map_{ranking.kind}"
    if ranking.kind == "attention":
        head = i18n.text(lang, "faithfulness.head_mean") if ranking.head == "mean" else \
            i18n.text(lang, "faithfulness.head_one", head=int(ranking.head) + 1)
        return i18n.text(lang, key, layer=ranking.layer + 1, head=head)
    if ranking.kind == "norm":
        return i18n.text(lang, key, layer=ranking.layer + 1)
    if ranking.kind == "relevance":
        return i18n.text(lang, key, label=ranking.label)
    if ranking.kind == "random":
        return i18n.text(lang, key, number=ranking.name.rsplit(" ", 1)[-1])
    return i18n.text(lang, key)


def sentence(result: Faithfulness, lang: str = "en") -> str:
    """One sentence measured on this photo: the best map's deletion area against the last layer's attention
    (or the worst map, when that is the best) and the random orders, and what each comparison says."""
    ranked = result.ranked()
    if not ranked or len(result.random) < 2:
        return i18n.text(lang, "faithfulness.sentence_none")
    best = ranked[0]
    other = max((c for c in ranked if c.ranking.kind == "attention" and c.ranking.head == "mean"),
                key=lambda c: c.ranking.layer, default=ranked[-1])
    if other is best:
        other = ranked[-1]
    mean, spread = result.random_deletion

    def said(curve: Curve) -> str:
        return i18n.text(lang, f"faithfulness.verdict_{result.verdict(curve)}", name=map_name(curve.ranking, lang))

    parts = dict(best=map_name(best.ranking, lang), best_area=f"{best.deletion_area:.2f}",
                 other=map_name(other.ranking, lang), other_area=f"{other.deletion_area:.2f}",
                 mean=f"{mean:.2f}", spread=f"{spread:.2f}", orders=len(result.random),
                 fill=i18n.text(lang, f"faithfulness.fill_{result.fill}"),
                 measure=i18n.text(lang, f"faithfulness.measure_{result.measure}"),
                 best_verdict=said(best), other_verdict=said(other))
    if best is other:
        return i18n.text(lang, "faithfulness.sentence_one", **parts)
    return i18n.text(lang, "faithfulness.sentence", **parts)


def table(result: Faithfulness, lang: str = "en") -> list[dict]:
    """The ranked table: one row per map (best first), then the random orders' mean ± spread."""
    rows = []
    for place, c in enumerate(result.ranked(), 1):
        rows.append({"rank": place, "map": map_name(c.ranking, lang), "deletion_area": c.deletion_area,
                     "insertion_area": c.insertion_area, "deletion_verdict": result.verdict(c, "deletion"),
                     "insertion_verdict": result.verdict(c, "insertion")})
    (dm, ds), (im, is_) = result.random_deletion, result.random_insertion
    rows.append({"rank": None, "map": i18n.text(lang, "faithfulness.random_row", orders=len(result.random)),
                 "deletion_area": dm, "insertion_area": im, "deletion_spread": ds, "insertion_spread": is_,
                 "deletion_verdict": "random", "insertion_verdict": "random"})
    return rows


__all__ = ["FILLS", "Curve", "Faithfulness", "FaithfulnessError", "Ranking", "area", "faithfulness", "map_name",
           "rank", "sentence", "standard_rankings", "steps_removed", "table"]
