"""The numbers behind the classroom lesson: attention worked by hand, and checked on a real model.

Scaled dot-product attention (Vaswani et al. 2017, "Attention Is All You Need", eq. 1):

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

Every function here returns plain values (small frozen dataclasses of numpy arrays) that a page, a
notebook or a test can use; nothing here draws. The last part is a removal test in the spirit of
Jain & Wallace (NAACL 2019, "Attention is not Explanation") and Wiegreffe & Pinter (EMNLP 2019,
"Attention is not not Explanation"): does taking away the most-attended patches change the model's
output more than taking away random ones?
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from . import i18n, interventions
from .capture import Capture, Head
from .neuron import window_pair
from .models import Model

Fill = Literal["mean", "blur"]
FILLS: tuple[Fill, ...] = ("mean", "blur")
LESSON_SIZES = (196, 224, 448, 518)  # the app's input sizes for the patch-14 default model
FP32_BYTES = 4


def softmax(scores: Sequence[float] | np.ndarray, scale: float = 1.0) -> np.ndarray:
    """softmax(scale · scores) in float64; subtracting the max first changes nothing but avoids overflow."""
    s = np.asarray(scores, dtype=np.float64) * scale
    e = np.exp(s - s.max())
    return e / e.sum()


# --- Step 2: one query, three keys, by hand ----------------------------------------------------

@dataclass(frozen=True)
class WorkedExample:
    """Every intermediate number of softmax(q Kᵀ / √d_k) V for one query."""

    query: np.ndarray  # (d_k,)
    keys: np.ndarray  # (n, d_k)
    values: np.ndarray  # (n, d_v)
    scores: np.ndarray  # (n,) q · k_j
    scaled: np.ndarray  # (n,) q · k_j / √d_k
    exps: np.ndarray  # (n,) e^(scaled_j), not shifted: these are the numbers a student writes down
    weights: np.ndarray  # (n,) exps / Σ exps
    output: np.ndarray  # (d_v,) Σ_j weights_j · v_j

    @property
    def d_k(self) -> int:
        return self.query.shape[0]

    @property
    def exp_sum(self) -> float:
        return float(self.exps.sum())


def worked_example(query, keys, values=None) -> WorkedExample:
    """Attention of one ``query`` over ``keys``; ``values`` default to the keys themselves.

    Inputs are small hand-typed numbers, so e^(score) is computed as written (float64 overflows only
    beyond e^709); the weights use the shifted, overflow-free softmax and equal exps / Σ exps.
    """
    q = np.asarray(query, dtype=np.float64)  # (d_k,)
    k = np.asarray(keys, dtype=np.float64)  # (n, d_k)
    v = k if values is None else np.asarray(values, dtype=np.float64)  # (n, d_v)
    if k.ndim != 2 or q.shape != (k.shape[1],) or v.ndim != 2 or v.shape[0] != k.shape[0]:
        raise ValueError(f"need query (d_k,), keys (n, d_k), values (n, d_v); got {q.shape}, {k.shape}, {v.shape}")
    scores = k @ q  # (n,)
    scaled = scores / math.sqrt(q.shape[0])
    weights = softmax(scaled)
    return WorkedExample(q, k, v, scores, scaled, np.exp(scaled), weights, weights @ v)


# --- Step 3: why divide by √d_k -----------------------------------------------------------------

@dataclass(frozen=True)
class DotProducts:
    """q · k for random q, k whose entries have mean 0 and variance 1."""

    d_k: int
    dots: np.ndarray  # (n,) q · k: variance d_k
    scaled: np.ndarray  # (n,) q · k / √d_k: variance 1

    @property
    def dots_var(self) -> float:
        return float(self.dots.var())

    @property
    def scaled_var(self) -> float:
        return float(self.scaled.var())


def dot_products(d_k: int, samples: int = 4000, seed: int = 0) -> DotProducts:
    """Sample ``samples`` pairs of standard-normal q, k ∈ ℝ^d_k (same seed, same numbers).

    q · k is a sum of d_k products with variance 1 each, so its variance is d_k and its typical size
    √d_k (8 for d_k = 64); dividing by √d_k brings the variance back to 1 for every d_k.
    """
    if d_k < 1 or samples < 2:
        raise ValueError("need d_k ≥ 1 and at least 2 samples")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((samples, d_k))
    k = rng.standard_normal((samples, d_k))
    dots = np.einsum("nd,nd->n", q, k)  # (samples,)
    return DotProducts(d_k, dots, dots / math.sqrt(d_k))


# --- Step 1: the real model's shapes ------------------------------------------------------------

@dataclass(frozen=True)
class Shapes:
    """Sizes of one attention layer: X (N × D) → Q, K, V per head (N × d_k) → weights (N × N)."""

    tokens: int  # N
    embed_dim: int  # D
    heads: int  # H
    head_dim: int  # d_k
    layers: int  # L
    patch: int
    grid: tuple[int, int]
    prefix_tokens: int
    qkv_weight: tuple[int, ...]  # timm stores W_Q, W_K, W_V of all heads as one Linear: (3 · H · d_k, D)


def shapes(model: Model) -> Shapes:
    return Shapes(
        tokens=model.num_tokens, embed_dim=model.embed_dim, heads=model.num_heads, head_dim=model.head_dim,
        layers=model.depth, patch=model.patch, grid=model.grid, prefix_tokens=model.num_prefix_tokens,
        qkv_weight=(3 * model.num_heads * model.head_dim, model.embed_dim),
    )


# --- Step 4: from one query–key pair to one heatmap cell ---------------------------------------

@dataclass(frozen=True)
class PairScore:
    """How the weight of key token ``key`` in query token ``query``'s row comes about (float64)."""

    layer: int
    head: int
    query: int  # token index, 0 = class token
    key: int  # token index
    dot: float  # q_i · k_j
    scale: float  # 1 / √d_k
    scaled: float  # q_i · k_j / √d_k
    exp: float  # e^(scaled)
    exp_sum: float  # Σ_m e^(q_i · k_m / √d_k) over all N keys
    weight: float  # exp / exp_sum


def token_index(cap: Capture, row: int, col: int, layer: int = 0) -> int:
    """The token number of the patch at cell (row, col) of layer ``layer``'s grid: prefix tokens come first,
    then raster order."""
    lay = cap.layout(layer)
    h, w = lay.grid
    if not (0 <= row < h and 0 <= col < w):
        raise IndexError(f"patch ({row}, {col}) is outside the {h} × {w} grid")
    return lay.prefix + row * w + col


def pair_score(cap: Capture, layer: int, head: int, query: int, key: int) -> PairScore:
    """Recompute one attention weight from the captured q and k vectors, step by step (inside the query's
    window, where the layer has windows)."""
    window, i, j = window_pair(cap, layer, head, query, key)
    q = window.query[head, i].double().cpu().numpy()  # (d_k,)
    k = window.key[head].double().cpu().numpy()  # (Tk, d_k)
    scaled_row = window.logits(head)[i]  # (Tk,): q · k · scale (+ bias, where the layer has one)
    # e^s can overflow for large scores; shift by the row max for the sum and shift back (in log space).
    top = scaled_row.max()
    log_sum = top + math.log(np.exp(scaled_row - top).sum())
    scaled = float(scaled_row[j])
    return PairScore(
        layer=layer, head=head, query=query, key=key, dot=float(k[j] @ q), scale=float(window.scale),
        scaled=scaled, exp=math.exp(min(scaled, 709.0)), exp_sum=math.exp(min(log_sum, 709.0)),
        weight=math.exp(scaled - log_sum),
    )


# --- Step 6: the cost of length -----------------------------------------------------------------

@dataclass(frozen=True)
class Cost:
    size: int  # input side S in pixels
    grid: int  # patches per side, S / patch
    tokens: int  # N = prefix + grid²
    pairs: int  # N² query–key pairs per head
    map_bytes: int  # all L × H maps of N × N weights in fp32
    qk_bytes: int  # all L × H queries and keys (N × d_k each) in fp32: what a Capture keeps instead


def cost_table(
    sizes: Sequence[int] = LESSON_SIZES,
    patch: int = 14,
    prefix_tokens: int = 1,
    layers: int = 12,
    heads: int = 6,
    head_dim: int = 64,
) -> tuple[Cost, ...]:
    """N, N² and the memory of every attention map for each input size (defaults: the offline ViT-S/14)."""
    rows = []
    for size in sizes:
        if size % patch:
            raise ValueError(f"{size} px is not a multiple of the {patch} px patch")
        grid = size // patch
        tokens = prefix_tokens + grid * grid
        maps = layers * heads * tokens * tokens * FP32_BYTES
        rows.append(Cost(size, grid, tokens, tokens * tokens, maps, 2 * layers * heads * tokens * head_dim * FP32_BYTES))
    return tuple(rows)


# --- Step 7: is the most-attended part what the output depends on? -----------------------------

@dataclass(frozen=True)
class Perturbation:
    """Output change as patches are removed: most-attended first versus in random order.

    ``change`` is the drop in the probability of the originally predicted class for a classifier,
    and the cosine distance 1 − cos(f, f₀) of the output features otherwise (0 = unchanged).
    """

    removed: np.ndarray  # (steps + 1,) number of patches removed at each step, starting at 0
    num_patches: int
    attended: np.ndarray  # (steps + 1,) change, most-attended patches removed first
    random: np.ndarray  # (repeats, steps + 1) change, patches removed in random order
    metric: Literal["probability", "cosine"]
    target: int | None  # the class followed (classifier models)
    base_probability: float | None  # its probability on the untouched photo
    order: np.ndarray  # (num_patches,) patch indices (raster order), most attended first
    random_orders: np.ndarray  # (repeats, num_patches)

    @property
    def fractions(self) -> np.ndarray:
        return self.removed / self.num_patches

    @property
    def random_mean(self) -> np.ndarray:
        return self.random.mean(0)

    @property
    def race(self) -> "Race":
        """What the chart shows, in its own numbers (:func:`race`)."""
        return race(self)


Story = Literal["ahead", "mostly_ahead", "caught_up", "overtaken", "same", "behind"]


@dataclass(frozen=True)
class Race:
    """The step-7 chart in numbers: the red curve (most-attended patches removed first) against the grey one (the mean
    of the random orders), by the area under each over the share of patches removed (0 … ``percent`` / 100) and by
    where each ends. A difference is only told when it is beyond how much the random orders disagree among
    themselves (half the range of their own areas, or of their own end points)."""

    attended_area: float
    random_area: float
    area_spread: float  # half the range of the random orders' areas
    attended_end: float  # the red curve at the last step
    random_end: float  # the grey curve at the last step
    end_spread: float  # half the range of the random orders at the last step
    percent: float  # patches removed at the last step, in %
    level_at: tuple[float, ...]  # % removed (after 0) where the grey curve is level with or above the red one
    story: Story
    # ahead: more on area, and above the grey curve at every step · mostly_ahead: more on area and at the end, level
    # with or below it somewhere between · caught_up: more on area, but the ends are within the random orders' spread
    # · overtaken: more on area, but random removal ends higher · same: areas within the spread · behind: less on area


def area(fractions: np.ndarray, curve: np.ndarray) -> np.ndarray:
    """(...) areas under curves (..., steps + 1) drawn through the points (fractions, curve), by the trapezoid rule."""
    heights = (curve[..., 1:] + curve[..., :-1]) / 2
    return (heights * np.diff(fractions)).sum(-1)


def race(p: Perturbation) -> Race:
    """:class:`Race` of a removal test: which curve is ahead, on area and at the end, and whether random removal
    catches up with or overtakes the most-attended-first order."""
    x = p.fractions
    mean = p.random_mean
    areas = area(x, p.random)  # (R,): each random order's own
    attended_area, random_area = float(area(x, p.attended)), float(area(x, mean))
    area_spread = float((areas.max() - areas.min()) / 2)
    attended_end, random_end = float(p.attended[-1]), float(mean[-1])
    end_spread = float((p.random[:, -1].max() - p.random[:, -1].min()) / 2)
    level = tuple(float(100 * f) for f, a, r in zip(x[1:], p.attended[1:], mean[1:]) if r >= a)
    lead, end = attended_area - random_area, attended_end - random_end
    story: Story
    if lead > area_spread:
        if end < -end_spread:
            story = "overtaken"
        elif end <= end_spread:
            story = "caught_up"
        else:
            story = "mostly_ahead" if level else "ahead"
    else:
        story = "behind" if lead < -area_spread else "same"
    return Race(attended_area, random_area, area_spread, attended_end, random_end, end_spread, float(100 * x[-1]),
                level, story)


def race_sentence(race: Race, lang: str = "en") -> str:
    """What the chart shows, in ``lang``, with the chart's numbers: which curve is ahead on area and at the end, and
    whether random removal catches up with or overtakes the most-attended-first order."""
    return i18n.text(lang, f"lesson.explain.{race.story}", attended_area=race.attended_area,
                     random_area=race.random_area, area_spread=race.area_spread, attended_end=race.attended_end,
                     random_end=race.random_end, end_spread=race.end_spread, percent=race.percent,
                     level=i18n.join(lang, (f"{p:.0f}%" for p in race.level_at)))


def fill_image(x: torch.Tensor, fill: Fill, patch: int) -> torch.Tensor:
    """What removed patches are replaced by: the photo's mean colour, or a heavily blurred photo."""
    if fill == "mean":
        return x.mean(dim=(2, 3), keepdim=True).expand_as(x)
    if fill == "blur":
        # σ of one patch: the patch's own detail is gone, only the colour of its neighbourhood remains.
        radius = min(2 * patch, (min(x.shape[-2:]) - 1) // 2)
        return TF.gaussian_blur(x, kernel_size=2 * radius + 1, sigma=float(patch))
    raise ValueError(f"fill must be one of {FILLS}, not {fill!r}")


def remove_patches(
    x: torch.Tensor, patches: Sequence[int] | np.ndarray, grid: tuple[int, int], patch: int, filled: torch.Tensor
) -> torch.Tensor:
    """Copy of the (1, 3, S, S) input with the listed patches (raster order) taken from ``filled``."""
    h, w = grid
    mask = torch.zeros(h * w, dtype=torch.bool, device=x.device)
    mask[torch.as_tensor(np.asarray(patches, dtype=np.int64), device=x.device)] = True
    pixels = mask.view(h, w).repeat_interleave(patch, 0).repeat_interleave(patch, 1)  # (h·p, w·p)
    full = torch.zeros(x.shape[-2:], dtype=torch.bool, device=x.device)
    full[: h * patch, : w * patch] = pixels
    return torch.where(full, filled, x)


def _outputs(model: Model, xs: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """(B, C): the network's outputs on ``xs``, in batches of at most ``batch``, as many at once as the cores."""

    @torch.inference_mode()  # per thread: the pool's threads do not inherit it
    def run(part: torch.Tensor) -> torch.Tensor:
        return model.adapter.forward_batch(model.network, part)  # timm and Hugging Face networks answer differently

    with interventions.per_core("attnviz-lesson") as (pool, workers):
        parts = xs.tensor_split(workers * math.ceil(xs.shape[0] / (workers * batch)))  # every core the same share
        return torch.cat(list(pool.map(run, [p for p in parts if len(p)]))).float()


def ranking(cap: Capture, layer: int, head: Head = "mean") -> np.ndarray:
    """(P,) the patches (raster order of ``cap.map_grid(layer)``) by the heatmap of the main page in ``layer`` /
    ``head``, most attended first: the order :func:`perturbation` removes them in."""
    return np.argsort(-cap.summary_map(layer, head).ravel(), kind="stable")


def perturbation(
    model: Model,
    cap: Capture,
    layer: int,
    head: Head = "mean",
    *,
    fill: Fill = "mean",
    steps: int = 6,
    max_fraction: float = 0.5,
    repeats: int = 3,
    seed: int = 0,
) -> Perturbation:
    """Remove up to ``max_fraction`` of the patches in ``steps`` equal steps and measure the output change.

    Patches are ranked by the heatmap of the main page in ``layer`` / ``head`` (the class token's
    attention, or the mean attention received for a model without a class token). Costs 1 + steps · (1 + repeats) forward passes (25 by default).
    """
    if not 1 <= steps <= 20 or not 0 < max_fraction <= 1 or repeats < 1:
        raise ValueError("need 1 ≤ steps ≤ 20, 0 < max_fraction ≤ 1 and repeats ≥ 1")
    grid = cap.map_grid(layer)  # the cells of the map that ranks them: a stage's own grid in a model with stages
    patch = cap.input.shape[-1] // grid[1]
    num_patches = grid[0] * grid[1]
    order = ranking(cap, layer, head)  # (P,) most attended first
    rng = np.random.default_rng(seed)
    random_orders = np.stack([rng.permutation(num_patches) for _ in range(repeats)])  # (R, P)
    removed = np.round(np.linspace(0, max_fraction * num_patches, steps + 1)).astype(int)  # (steps + 1,)

    x = cap.input
    filled = fill_image(x, fill, patch)
    orders = [order, *random_orders]
    inputs = [x] + [remove_patches(x, o[:n], grid, patch, filled) for o in orders for n in removed[1:]]
    out = _outputs(model, torch.cat(inputs))  # (1 + (1 + R) · steps, C)
    base, rest = out[0], out[1:].view(1 + repeats, steps, -1)  # (C,), (1 + R, steps, C)

    if model.labels is not None:
        target = int(base.argmax())
        p0 = float(base.softmax(-1)[target])
        change = p0 - rest.softmax(-1)[..., target]  # (1 + R, steps)
        metric, base_probability = "probability", p0
    else:
        target, base_probability, metric = None, None, "cosine"
        change = 1 - torch.nn.functional.cosine_similarity(rest, base.expand_as(rest), dim=-1)
    change = torch.cat([torch.zeros(1 + repeats, 1), change.cpu()], dim=1).double().numpy()  # (1 + R, steps + 1)
    return Perturbation(
        removed=removed, num_patches=num_patches, attended=change[0], random=change[1:], metric=metric,
        target=target, base_probability=base_probability, order=order, random_orders=random_orders,
    )


def to_picture(model: Model, x: torch.Tensor) -> Image.Image:
    """The (1, 3, S, S) normalised input back as the S × S RGB picture it encodes."""
    mean = torch.tensor(model.data_config["mean"], device=x.device).view(3, 1, 1)
    std = torch.tensor(model.data_config["std"], device=x.device).view(3, 1, 1)
    rgb = (x[0] * std + mean).clamp(0, 1).mul(255).round().byte()  # (3, S, S)
    return Image.fromarray(rgb.permute(1, 2, 0).cpu().numpy())
