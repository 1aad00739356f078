"""The Q/K map of one head: every token's query and key as points in one 2-D picture.

AttentionViz (Yeh et al., IEEE VIS 2023, "AttentionViz: A Global View of Transformer Attention")
embeds the query and key vectors of one head jointly: a query lands near the keys it attends to
(a large q · k), and clusters show what the head sorts by — position, colour, the object. attnviz's
capture already holds every layer's exact queries and keys, so the map of one photo, or of a
dataset run's stored captures (``attnviz dataset --store qk``), is a projection away.

Data flows one way::

    captures → (P, d_k) points: each photo's N queries, then its N keys     (P = photos · 2N)
             → normalised (AttentionViz's translation and scaling, or none)
             → (P, 2) coordinates: PCA (exact, eigh of the scatter), UMAP or t-SNE (optional packages)
             → QKMap, with its statistics (how well 2-D distance follows q · k, how well position explains it)

Layers and heads are 0-based here, as in :class:`attnviz.Capture`; the page and the CLI count from 1.
"""
from __future__ import annotations

import colorsys
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import torch

from .i18n import text
from .capture import Capture
from .errors import LayoutError

Method = Literal["pca", "umap", "tsne"]
Normalize = Literal["attentionviz", "none"]
METHODS: tuple[str, ...] = ("pca", "umap", "tsne")
NORMALIZATIONS: tuple[str, ...] = ("attentionviz", "none")
COLOURINGS: tuple[str, ...] = ("row", "column", "brightness", "hue", "cls_attention", "photo")
MAX_PHOTOS = 200  # the most photos one map takes (200 × 394 points ≈ 79 000 at 196 px)
_PACKAGES = {"umap": ("umap", "umap-learn"), "tsne": ("sklearn", "scikit-learn")}
BLAS_POINTS = 20_000  # above this many points a projection uses BLAS (matmul); below, einsum (see pca)
STAT_PAIRS = 200_000  # (query, key) pairs the rank correlation samples, when a map has more


class ProjectionUnavailable(ImportError):
    """UMAP or t-SNE asked for without its package; ``str()`` is one sentence naming the pip command."""


def available(method: str) -> bool:
    """Whether ``method`` can run here (PCA always; UMAP and t-SNE need their optional packages)."""
    return method == "pca" or (method in _PACKAGES and importlib.util.find_spec(_PACKAGES[method][0]) is not None)


def missing_message(method: str) -> str:
    module, package = _PACKAGES[method]
    name = {"umap": "UMAP", "tsne": "t-SNE"}[method]
    return f"{name} needs the {package} package: pip install 'attnviz[qk]' (or pip install {package})."


@dataclass(frozen=True, eq=False)
class QKMap:
    """One head's queries and keys as 2-D points. Point ``i`` is the ``kind[i]`` vector ("query" or "key")
    of token ``token[i]`` of photo ``photo[i]``; per photo its N queries come first, then its N keys.

    ``vectors`` are the points before projection: exactly the capture's q and k when ``normalize`` is
    ``"none"``, else AttentionViz's normalised ones (:func:`normalise`).
    """

    layer: int  # 0-based
    head: int  # 0-based
    method: str
    normalize: str
    xy: np.ndarray  # (P, 2) float64: the 2-D coordinates
    is_key: np.ndarray  # (P,) bool: False for a query point, True for a key point
    photo: np.ndarray  # (P,) int: which capture (0-based, in the order given)
    token: np.ndarray  # (P,) int: token index in its photo (prefix tokens first, then patches in raster order)
    vectors: np.ndarray  # (P, d_k) float64: the points that were projected
    logits: tuple[np.ndarray, ...]  # per photo (N, N) float64: q · kᵀ · scale (+ bias), what enters softmax
    grid: tuple[int, int]  # (h, w) patches
    num_prefix_tokens: int

    @property
    def num_tokens(self) -> int:
        return self.logits[0].shape[0]

    @property
    def num_photos(self) -> int:
        return len(self.logits)

    @property
    def kind(self) -> np.ndarray:
        """(P,) "query" / "key" per point."""
        return np.where(self.is_key, "key", "query")

    @property
    def row(self) -> np.ndarray:
        """(P,) patch row of each point's token, −1 for a prefix token."""
        patch = self.token - self.num_prefix_tokens
        return np.where(patch >= 0, patch // self.grid[1], -1)

    @property
    def column(self) -> np.ndarray:
        """(P,) patch column of each point's token, −1 for a prefix token."""
        patch = self.token - self.num_prefix_tokens
        return np.where(patch >= 0, patch % self.grid[1], -1)

    def index(self, photo: int, token: int, key: bool) -> int:
        """The point of ``photo``'s ``token``'s query (``key=False``) or key."""
        n = self.num_tokens
        return photo * 2 * n + (n if key else 0) + token

    def top_keys(self, photo: int, token: int, count: int = 5) -> np.ndarray:
        """The ``count`` key tokens (of the same photo) that ``token``'s query attends to most, strongest first."""
        logits = self.logits[photo][token]  # (N,): softmax is monotone, so the largest logits are the largest weights
        return np.argsort(-logits, kind="stable")[:count]

    def records(self) -> list[dict]:
        """One plain record per point: kind, photo, token, x, y (the CLI's JSON)."""
        kinds = self.kind
        return [{"kind": str(kinds[i]), "photo": int(self.photo[i]), "token": int(self.token[i]),
                 "x": float(self.xy[i, 0]), "y": float(self.xy[i, 1])} for i in range(len(self.token))]


@dataclass(frozen=True)
class QKStats:
    """What a map shows, measured on its own points (the page's one sentence).

    ``distance_rho``: Spearman rank correlation, over (query, key) pairs of the same photo, between the
    logit q · k · scale and the 2-D distance of the two points — strongly negative when a query lands near
    the keys it attends to. ``row_r`` / ``column_r``: multiple correlation R of the patch row / column
    with the 2-D coordinates (least squares on x and y, patch tokens only) — near 1 when the map is laid
    out by position.
    """

    distance_rho: float
    row_r: float
    column_r: float
    pairs: int  # (query, key) pairs the rank correlation used

    @property
    def closeness(self) -> Literal["strong", "weak", "none", "against_weak", "against"]:
        """How the map's distances follow attention, from ``distance_rho``: nearer pairs attend more (≤ −0.4
        strong, < −0.1 weak), no order (|ρ| ≤ 0.1), or farther pairs attend more (> 0.1 against_weak, ≥ 0.4
        against; seen with AttentionViz's normalisation, e.g. +0.42 on the rocket photo)."""
        rho = self.distance_rho
        if rho <= -0.4:
            return "strong"
        if rho < -0.1:
            return "weak"
        if rho <= 0.1:
            return "none"
        return "against" if rho >= 0.4 else "against_weak"


# --- Normalisation ------------------------------------------------------------------------------

def normalise(query: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AttentionViz's normalisation of one head's (M, d_k) queries and keys: afterwards the key centroid is
    the query centroid and the mean key norm is the mean query norm, and softmax(q · kᵀ) is unchanged.

    Queries become c · q and keys (k + t) / c. The scaling leaves every q · k as it was; the translation t
    moves every logit of one query by the same q · t, which softmax ignores. Both conditions at once fix
    t = c² q̄ − k̄ and c² = mean ‖k − k̄ + c² q̄‖ / mean ‖q‖, solved by iteration: the right side changes by at
    most ‖q̄‖ / mean ‖q‖ < 1 times any change of c², so it converges.
    """
    q, k = normalise_many(query[None], key[None])
    return q[0], k[0]


def normalise_many(query: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`normalise` of B heads at once: (B, M, d_k) queries and keys."""
    q_bar, k_bar = query.mean(1, keepdims=True), key.mean(1, keepdims=True)  # (B, 1, d_k)
    spread = key - k_bar  # (B, M, d_k)
    q_norm = np.sqrt((query * query).sum(-1)).mean(1)  # (B,)
    # ‖spread_i + s q̄‖² = a_i + 2 s b_i + s² c: each step of the iteration is O(M), not O(M · d_k).
    a = (spread * spread).sum(-1)  # (B, M)
    b = (spread * q_bar).sum(-1)  # (B, M)
    c2 = (q_bar * q_bar).sum(-1)  # (B, 1)
    s = np.sqrt((key * key).sum(-1)).mean(1) / q_norm  # c², started where the translation is left out
    for _ in range(200):
        new = np.sqrt(np.maximum(a + 2 * s[:, None] * b + s[:, None] ** 2 * c2, 0)).mean(1) / q_norm
        done = np.all(np.abs(new - s) <= 1e-14 * np.maximum(1.0, s))
        s = new
        if done:
            break
    c = np.sqrt(s)[:, None, None]
    return query * c, (spread + c * c * q_bar) / c


# --- Projections --------------------------------------------------------------------------------

def pca(points: np.ndarray) -> np.ndarray:
    """(P, D) → (P, 2): the points on their first two principal axes, exactly (no sampling, no iteration).

    The axes are the top eigenvectors of the (D, D) scatter matrix of the centred points (numpy ``eigh``),
    the scatter summed with ``einsum``: on a busy 2-core machine multithreaded BLAS calls (an SVD of the
    (P, D) points) wait on each other for 50–250 ms, this takes ~3 ms. Each axis's sign is fixed so that
    its largest loading is positive (as scikit-learn's ``svd_flip``)."""
    return pca_many(points[None])[0]


def pca_many(points: np.ndarray) -> np.ndarray:
    """(B, P, D) → (B, P, 2): :func:`pca` of B point sets at once."""
    centred = points - points.mean(1, keepdims=True)
    if points.shape[1] > BLAS_POINTS:  # many photos: BLAS's threads pay for themselves
        scatter = np.matmul(centred.transpose(0, 2, 1), centred)  # (B, D, D)
    else:
        scatter = np.einsum("bpi,bpj->bij", centred, centred)
    _, vectors = np.linalg.eigh(scatter)  # ascending eigenvalues
    axes = vectors[:, :, ::-1][:, :, :2]  # (B, D, 2)
    largest = np.take_along_axis(axes, np.abs(axes).argmax(1)[:, None, :], 1)  # (B, 1, 2)
    axes = axes * np.sign(largest)
    return np.matmul(centred, axes) if points.shape[1] > BLAS_POINTS else np.einsum("bpi,bij->bpj", centred, axes)


def project(points: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """(P, D) → (P, 2) by PCA, UMAP or t-SNE; :class:`ProjectionUnavailable` when the package is missing."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if method == "pca":
        return pca(points)
    if not available(method):
        raise ProjectionUnavailable(missing_message(method))
    if method == "umap":
        import umap

        # A seed makes umap-learn run on one thread (it warns unless asked for one): the same picture on every rerun.
        neighbours = int(min(15, len(points) - 1))  # umap-learn's default, or every other point of a tiny map
        return np.asarray(umap.UMAP(n_components=2, n_neighbors=neighbours, random_state=seed, n_jobs=1)
                          .fit_transform(points), dtype=np.float64)
    from sklearn.manifold import TSNE

    perplexity = float(min(30.0, max(5.0, (len(points) - 1) / 3)))
    return np.asarray(TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed)
                      .fit_transform(points), dtype=np.float64)


# --- The map ------------------------------------------------------------------------------------

def _captures(caps: Capture | Sequence[Capture]) -> list[Capture]:
    caps = [caps] if isinstance(caps, Capture) else list(caps)
    if not caps:
        raise ValueError("a Q/K map needs at least one capture")
    if len(caps) > MAX_PHOTOS:
        raise ValueError(f"a Q/K map takes at most {MAX_PHOTOS} photos, not {len(caps)}")
    first = _shape(caps[0])
    for cap in caps[1:]:
        if _shape(cap) != first:
            raise ValueError("the captures of one Q/K map must come from the same model at the same input size")
    return caps


def _shape(cap: Capture) -> tuple:
    """What captures of one Q/K map must share: the input size and every layer's tokens and heads."""
    return (tuple(cap.input.shape), tuple((lay.grid, lay.keys_grid, lay.prefix, lay.num_key_prefix, lay.num_heads,
                                           lay.head_dim) for lay in cap.layouts))


def _check_head(cap: Capture, layer: int, head: int) -> None:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < cap.num_layers:
        raise IndexError(f"layer must be a whole number 0…{cap.num_layers - 1} (0-based), not {layer!r}")
    count = cap.heads(layer)
    if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 0 <= head < count:
        raise IndexError(f"head must be a whole number 0…{count - 1} (0-based), not {head!r}")


def mappable(cap: Capture, layer: int) -> bool:
    """Whether layer ``layer``'s queries and keys are one set of tokens that all attend to each other (one window
    of every token, keys not pooled) with one softmax per head: what a map of its points shows."""
    return cap.layout(layer).is_global and cap.plain_softmax(layer)


def obstacle(cap: Capture, layer: int) -> tuple[str, dict]:
    """What keeps layer ``layer`` from being one set of points that attend to each other, as the key of its words in
    the catalogue (``qkmap.how_<key>``) and their values: how the layer attends
    (:meth:`attnviz.stages.LayerLayout.attends`), or, where every token attends to every token, its softmax mixed
    across heads or blended with fixed weights (``mixed``), or its tokens kept in another order (``reordered``)."""
    lay = cap.layout(layer)
    key, values = lay.attends()
    if key != "global":
        return key, values
    return ("reordered", {}) if not lay.is_global else ("mixed", {})


def _window(cap: Capture, layer: int, head: int):
    _check_head(cap, layer, head)
    if not cap.layout(layer).is_global:
        key, values = obstacle(cap, layer)
        maps = [str(layer + 1) for layer in range(cap.num_layers) if mappable(cap, layer)]
        where = f" (this model's layers {', '.join(maps[:4])}{', …' if len(maps) > 4 else ''} have)" if maps else ""
        raise LayoutError(f"layer {layer + 1} {text('en', f'qkmap.how_{key}', **values)}, so its queries and keys "
                          f"are not one set of points that attend to each other; the Q/K map needs a layer with global "
                          f"attention{where}")
    return cap.window(layer, 0)


def head_vectors(cap: Capture, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, d_k), (N, d_k) float64: exactly the capture's queries and keys of one head."""
    window = _window(cap, layer, head)
    return (window.query[head].detach().cpu().double().numpy(), window.key[head].detach().cpu().double().numpy())


def _all_logits(caps: list[Capture], layer: int, head: int, pairs) -> tuple[np.ndarray, ...]:
    """Per photo (N, N) float64: the capture's own logits of one head, q · kᵀ · scale plus its bias if any."""
    windows = [_window(cap, layer, head) for cap in caps]
    if len(caps) == 1:
        return (windows[0].logits(head),)
    q = np.stack([q for q, _ in pairs]) * windows[0].scale  # (photos, N, d_k)
    k = np.stack([k for _, k in pairs])
    logits = np.matmul(q, k.transpose(0, 2, 1))  # (photos, N, N): one BLAS call for all photos
    if windows[0].bias is not None:
        logits = logits + np.stack([w.bias[head].detach().cpu().double().numpy() for w in windows])
    return tuple(logits)


def qk_map(caps: Capture | Sequence[Capture], layer: int, head: int, method: str = "pca",
           normalize: str = "attentionviz", seed: int = 0) -> QKMap:
    """The Q/K map of head (``layer``, ``head``), 0-based, of one capture or up to 200 of the same model."""
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, not {normalize!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    caps = _captures(caps)
    pairs = [head_vectors(cap, layer, head) for cap in caps]
    n = pairs[0][0].shape[0]
    query = np.concatenate([q for q, _ in pairs])  # (photos · N, d_k)
    key = np.concatenate([k for _, k in pairs])
    if normalize == "attentionviz":
        query, key = normalise(query, key)
    # Per photo: its N queries, then its N keys.
    vectors = np.concatenate([np.concatenate([query[i * n:(i + 1) * n], key[i * n:(i + 1) * n]])
                              for i in range(len(caps))])  # (photos · 2N, d_k)
    tokens = np.arange(n)
    return QKMap(
        layer=int(layer), head=int(head), method=method, normalize=normalize,
        xy=project(vectors, method, seed),
        is_key=np.tile(np.repeat([False, True], n), len(caps)),
        photo=np.repeat(np.arange(len(caps)), 2 * n),
        token=np.tile(np.concatenate([tokens, tokens]), len(caps)),
        vectors=vectors,
        logits=_all_logits(caps, layer, head, pairs),
        grid=tuple(caps[0].layout(layer).grid), num_prefix_tokens=caps[0].layout(layer).prefix,
    )


# --- Statistics ---------------------------------------------------------------------------------

def _ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two (M,) arrays (ties broken by order: the values here are real numbers)."""
    ra, rb = _ranks(a) - (len(a) - 1) / 2, _ranks(b) - (len(b) - 1) / 2
    return float((ra * rb).sum() / np.sqrt((ra * ra).sum() * (rb * rb).sum()))


def multiple_r(target: np.ndarray, xy: np.ndarray) -> float:
    """R of the least-squares fit target ≈ a + b·x + c·y: √(1 − residual / total variance), in [0, 1]."""
    return float(_multiple_r(target, xy[None])[0])


def _multiple_r(target: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """(M,), (B, M, K) → (B,): R of target on each of B sets of K regressors (normal equations, centred)."""
    t = target - target.mean()
    x = xy - xy.mean(1, keepdims=True)  # (B, M, K)
    gram = np.einsum("bmi,bmj->bij", x, x)  # (B, K, K)
    moment = np.einsum("bmi,m->bi", x, t)  # (B, K)
    total = t @ t
    if total == 0:
        return np.zeros(len(xy))
    fit = np.linalg.solve(gram, moment[..., None])[..., 0]  # (B, K)
    explained = np.einsum("bi,bi->b", fit, moment)  # = ‖x · fit‖² at the least-squares solution
    return np.sqrt(np.clip(explained / total, 0.0, 1.0))


def statistics(qk: QKMap, max_pairs: int = STAT_PAIRS, seed: int = 0) -> QKStats:
    """Measure ``qk``: rank correlation of q · k with 2-D distance, and how well position explains the layout."""
    n, photos = qk.num_tokens, qk.num_photos
    total = photos * n * n
    if total > max_pairs:  # sample (photo, query, key) triples before any distance is computed
        pick = np.random.default_rng(seed).choice(total, max_pairs, replace=False)
        photo, rest = np.divmod(pick, n * n)
        i, j = np.divmod(rest, n)
    else:
        photo, i, j = (a.ravel() for a in np.meshgrid(np.arange(photos), np.arange(n), np.arange(n), indexing="ij"))
    logits = np.stack(qk.logits)[photo, i, j]
    q_xy, k_xy = qk.xy[photo * 2 * n + i], qk.xy[photo * 2 * n + n + j]  # (pairs, 2) each
    distances = np.sqrt(((q_xy - k_xy) ** 2).sum(-1))
    patches = qk.token >= qk.num_prefix_tokens
    return QKStats(
        distance_rho=spearman(logits, distances),
        row_r=multiple_r(qk.row[patches].astype(float), qk.xy[patches]),
        column_r=multiple_r(qk.column[patches].astype(float), qk.xy[patches]),
        pairs=len(logits),
    )


# --- Colours ------------------------------------------------------------------------------------

def patch_colours(cap: Capture, grid: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(h, w), (h, w): each patch's (each cell of ``grid``'s, the first layer's by default) mean brightness
    (0…1, Rec. 601 luma) and the hue (0…1) of its mean colour, from the picture the model saw (recovered
    exactly from the capture's input)."""
    if cap.prepared is None:
        raise ValueError("this capture does not say how its photo was prepared, so its pixels cannot be recovered")
    pixels = np.asarray(cap.prepared.picture(cap.input), dtype=np.float64) / 255  # (S, S, 3)
    h, w = cap.grid if grid is None else grid
    s = pixels.shape[0]
    p = s // h
    means = pixels[:h * p, :w * p].reshape(h, p, w, p, 3).mean((1, 3))  # (h, w, 3)
    brightness = means @ np.array([0.299, 0.587, 0.114])
    hue = np.array([[colorsys.rgb_to_hsv(*means[i, j])[0] for j in range(w)] for i in range(h)])
    return brightness, hue


def colour_values(qk: QKMap, caps: Capture | Sequence[Capture], by: str) -> np.ndarray:
    """(P,) float: the value each point is coloured by; NaN where it has none (a prefix token's row).

    ``by``: ``row``, ``column`` (patch position), ``brightness`` / ``hue`` (of the photo at the patch),
    ``cls_attention`` (the weight the class token's query gives this token, in this head), ``photo``."""
    if by not in COLOURINGS:
        raise ValueError(f"colour by one of {COLOURINGS}, not {by!r}")
    caps = _captures(caps)
    patch = qk.token - qk.num_prefix_tokens
    if by in ("row", "column"):
        values = (qk.row if by == "row" else qk.column).astype(float)
        return np.where(patch >= 0, values, np.nan)
    if by == "photo":
        return qk.photo.astype(float)
    per_photo = []
    for cap in caps:
        if by == "cls_attention":
            per_photo.append(cap.row(qk.layer, qk.head, 0).astype(np.float64))  # (N,)
        else:
            brightness, hue = patch_colours(cap, qk.grid)
            grid = (brightness if by == "brightness" else hue).ravel()
            per_photo.append(np.concatenate([np.full(qk.num_prefix_tokens, np.nan), grid]))
    table = np.stack(per_photo)  # (photos, N)
    return table[qk.photo, qk.token]


# --- The atlas: every head at once --------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Atlas:
    """PCA maps of every head of one capture, AttentionViz-normalised: ``xy[layer, head]`` is (2N, 2),
    the N queries then the N keys; ``row_r`` / ``column_r`` (L, H) as in :class:`QKStats`."""

    xy: np.ndarray  # (L, H, 2N, 2)
    row_r: np.ndarray  # (L, H)
    column_r: np.ndarray  # (L, H)
    num_prefix_tokens: int
    grid: tuple[int, int]


def atlas(cap: Capture, normalize: str = "attentionviz") -> Atlas:
    """The L × H head atlas of one capture (PCA): one small map per head, and how much each sorts by position."""
    if not cap.uniform or not all(map(cap.plain_softmax, range(cap.num_layers))):
        raise LayoutError("the atlas lays every head on the same tokens, but this model's layers differ in grid, "
                          "windows or heads; open one head's Q/K map instead")
    layers, heads = cap.num_layers, cap.num_heads
    n, p = cap.num_tokens, cap.num_prefix_tokens
    tokens = np.concatenate([np.arange(n), np.arange(n)])
    patches = tokens >= p
    query = torch.stack(cap.query)[:, :, 0].detach().cpu().double().numpy().reshape(layers * heads, n, -1)  # (L·H, N, d_k)
    key = torch.stack(cap.key)[:, :, 0].detach().cpu().double().numpy().reshape(layers * heads, n, -1)
    if normalize == "attentionviz":
        query, key = normalise_many(query, key)
    xy = pca_many(np.concatenate([query, key], 1))  # (L·H, 2N, 2)
    rows, cols = ((tokens - p) // cap.grid[1])[patches], ((tokens - p) % cap.grid[1])[patches]
    row_r = _multiple_r(rows.astype(float), xy[:, patches]).reshape(layers, heads)
    column_r = _multiple_r(cols.astype(float), xy[:, patches]).reshape(layers, heads)
    return Atlas(xy.reshape(layers, heads, 2 * n, 2), row_r, column_r, p, tuple(cap.grid))


def position_colours(atlas_: Atlas) -> np.ndarray:
    """(2N, 3) uint8: each point's colour in the atlas — red grows down the patch rows, green across the
    columns, so a head that sorts by position shows a smooth gradient; prefix tokens are black."""
    n = atlas_.xy.shape[2] // 2
    h, w = atlas_.grid
    tokens = np.concatenate([np.arange(n), np.arange(n)]) - atlas_.num_prefix_tokens
    rows, cols = tokens // w, tokens % w
    colours = np.stack([40 + 215 * rows / max(h - 1, 1), 40 + 215 * cols / max(w - 1, 1), np.full(2 * n, 150.0)], -1)
    colours[tokens < 0] = 0
    return colours.astype(np.uint8)


def atlas_picture(atlas_: Atlas, tile: int = 72, gap: int = 4):
    """The atlas as one PIL picture: L rows × H columns of ``tile`` px squares, each head's points drawn as
    2 × 2 px dots (queries and keys alike) coloured by patch position (:func:`position_colours`)."""
    from PIL import Image

    layers, heads, points, _ = atlas_.xy.shape
    side = tile + gap
    canvas = np.full((layers * side + gap, heads * side + gap, 3), 255, np.uint8)
    colours = position_colours(atlas_)
    inner = tile - 6  # a 3 px margin inside each tile
    for layer in range(layers):
        for head in range(heads):
            xy = atlas_.xy[layer, head]
            top, left = gap + layer * side, gap + head * side
            canvas[top:top + tile, left:left + tile] = 246
            lo, span = xy.min(0), np.ptp(xy, 0)
            span[span == 0] = 1
            scale = inner / span.max()  # equal scale on both axes: distances stay distances
            px = (xy - lo) * scale + (inner - span * scale) / 2 + 3
            cols, rows = px[:, 0].astype(int), (tile - 2 - px[:, 1]).astype(int)  # y grows upwards
            for dy in (0, 1):
                for dx in (0, 1):
                    canvas[top + np.clip(rows + dy, 0, tile - 1), left + np.clip(cols + dx, 0, tile - 1)] = colours
    return Image.fromarray(canvas)


# --- A dataset run's stored captures ------------------------------------------------------------

def run_captures(out: str | Path, limit: int = MAX_PHOTOS, layer: int | None = None,
                 head: int | None = None) -> tuple[list[Capture], list[str]]:
    """The stored captures (``attnviz dataset --store qk``) of a run folder, in the run's path order, at most
    ``limit``; and the paths of the photos they belong to. With ``layer`` and ``head`` (0-based) each capture
    keeps only that head's q and k, as its layer 0 and head 0 (a 196 px capture of ViT-S: 7.3 MB → 0.1 MB),
    so 200 of them fit in memory. Captures that are missing, damaged or of another layout than the first are
    left out. Raises :class:`attnviz.RunError` when the run kept none."""
    import zipfile

    import attnviz.runfiles as runfiles
    from .errors import ExportError, RunError, RunFileError
    from .export import load_capture

    out = Path(out)
    run = runfiles.open_run(out)
    caps, paths, shape = [], [], None
    for path, digest in zip(run.images["path"].to_pylist(), run.images["digest"].to_pylist()):
        if len(caps) >= limit:
            break
        file = out / "captures" / f"{digest}.npz"
        try:
            runfiles.check_file(file, runfiles.MAX_CAPTURE_BYTES, file.name)
            with zipfile.ZipFile(file) as archive:  # the sizes its arrays declare, before any is read
                if sum(member.file_size for member in archive.infolist()) > runfiles.MAX_CAPTURE_BYTES:
                    continue
            cap = load_capture(file)
        except (RunFileError, ExportError, zipfile.BadZipFile, OSError, ValueError, KeyError, TypeError):
            continue
        layout = _shape(cap)
        if shape is not None and layout != shape:
            continue
        if layer is not None and head is not None:
            try:
                _check_head(cap, layer, head)
            except IndexError as e:
                raise RunError(f"the run {out.name} has no such head: {e}.") from None
            try:
                _window(cap, layer, head)
            except LayoutError as e:
                raise RunError(f"the run {out.name}: {e}.") from None
            cap = cap.only(layer, head)
        shape = layout
        caps.append(cap)
        paths.append(path)
    if not caps:
        raise RunError(f"the run {out.name} kept no queries and keys: run attnviz dataset with --store qk.")
    return caps, paths


# --- Patch search -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Match:
    """A key of another photo that a query attends to strongly: ``logit`` = q · k · scale."""

    photo: int  # index into the captures searched
    token: int
    logit: float


def patch_search(caps: Sequence[Capture], layer: int, head: int, photo: int, token: int,
                 count: int = 8) -> tuple[Match, ...]:
    """The ``count`` keys of the *other* photos that the query of ``photo``'s ``token`` would attend to most in
    head (``layer``, ``head``): a nearest-neighbour search by the attention logit q · k · scale over their
    patch keys (prefix tokens left out), strongest first. Logits compare across photos; softmax would turn
    them into weights only among the keys of one photo."""
    caps = _captures(caps)
    if not 0 <= photo < len(caps):
        raise IndexError(f"photo must be 0…{len(caps) - 1}, not {photo}")
    q, _ = head_vectors(caps[photo], layer, head)
    if not 0 <= token < len(q):
        raise IndexError(f"token must be 0…{len(q) - 1}, not {token}")
    p = caps[0].layout(layer).prefix
    others = [i for i in range(len(caps)) if i != photo]
    if not others:
        return ()
    keys = np.stack([head_vectors(caps[i], layer, head)[1][p:] for i in others])  # (photos − 1, P, d_k)
    logits = np.einsum("mpd,d->mp", keys, q[token]) * caps[0].layout(layer).scale  # (photos − 1, P)
    best = np.argsort(-logits.ravel(), kind="stable")[:count]
    rows, cols = np.divmod(best, logits.shape[1])
    return tuple(Match(others[r], int(c) + p, float(logits[r, c])) for r, c in zip(rows, cols))
