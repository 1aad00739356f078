"""Head statistics: entropy, mean attention distance in pixels, prefix share."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnviz
from attnviz.stats import entropy, head_stats, mean_distance


def test_entropy_known_values():
    assert entropy(torch.full((197,), 1 / 197)).item() == pytest.approx(math.log(197))
    assert entropy(torch.tensor([0.0, 1.0, 0.0])).item() == 0.0
    assert entropy(torch.tensor([0.5, 0.5, 0.0])).item() == pytest.approx(math.log(2))


def test_mean_distance_on_hand_made_geometry():
    # 1 CLS + 2 × 2 patches of 10 px. Patch tokens 1..4 are (0,0), (0,1), (1,0), (1,1).
    n = 5
    right = torch.zeros(n, n)
    diagonal = torch.zeros(n, n)
    selfish = torch.zeros(n, n)
    half = torch.zeros(n, n)
    for q, (nb, diag) in {1: (2, 4), 2: (1, 3), 3: (4, 2), 4: (3, 1)}.items():
        right[q, nb] = 1.0  # the horizontal neighbour: 10 px away
        diagonal[q, diag] = 1.0  # the diagonal patch: 10·√2 px away
        selfish[q, q], selfish[q, 0] = 0.5, 0.5  # itself and CLS: patch part is 0 px away
        half[q, q], half[q, nb] = 0.5, 0.5  # half itself, half the neighbour: 5 px
    right[0, 0] = diagonal[0, 0] = selfish[0, 0] = half[0, 0] = 1.0  # CLS row (not a patch query)
    weights = torch.stack([right, diagonal, selfish, half])  # (H, N, N)
    got = mean_distance(weights, (2, 2), 1, 10.0)
    np.testing.assert_allclose(got, [10.0, 10 * math.sqrt(2), 0.0, 5.0], atol=1e-5)


def numpy_stats(weights: np.ndarray, grid, prefix: int, patch_px: float):
    """Independent per-entry loops over (L, H, N, N)."""
    h, w = grid
    L, H, N, _ = weights.shape
    centre = lambda i: (((i - prefix) // w + 0.5) * patch_px, ((i - prefix) % w + 0.5) * patch_px)  # noqa: E731
    ent, dist, share = np.zeros((L, H)), np.zeros((L, H)), np.zeros((L, H))
    for l in range(L):
        for k in range(H):
            a = weights[l, k].astype(np.float64)
            ent[l, k] = -sum(p * math.log(p) for p in a[0] if p > 0)
            share[l, k] = a[0, :prefix].sum()
            total = 0.0
            for i in range(prefix, N):
                row = a[i, prefix:] / a[i, prefix:].sum()
                yi, xi = centre(i)
                for j in range(prefix, N):
                    total += row[j - prefix] * math.hypot(yi - centre(j)[0], xi - centre(j)[1])
            dist[l, k] = total / (N - prefix)
    return ent, dist, share


def test_head_stats_match_independent_loops(cat):
    from conftest import tiny_vit

    cap = attnviz.capture(tiny_vit(reg_tokens=2), cat)  # 3 prefix tokens, 8 px patches
    stats = head_stats(cap)
    ent, dist, share = numpy_stats(cap.all_weights(), cap.grid, 3, 8.0)
    assert stats.entropy.shape == (2, 4) and stats.patch_px == 8.0
    np.testing.assert_allclose(stats.entropy, ent, atol=1e-5)
    np.testing.assert_allclose(stats.distance, dist, atol=1e-4)
    np.testing.assert_allclose(stats.prefix_share, share, atol=1e-6)
    assert stats.max_entropy == pytest.approx(math.log(19))
    # uniform attention over the 4 × 4 grid of 8 px patches: mean over all ordered pairs of centres
    pairs = [(a, b) for a in range(16) for b in range(16)]
    mean = sum(8 * math.hypot(a // 4 - b // 4, a % 4 - b % 4) for a, b in pairs) / len(pairs)
    assert stats.uniform_distance == pytest.approx(mean)


def test_depth_trend_reads_the_distance_panel():
    """The most local and most global head and the two halves' means, heads a layer lacks (NaN) left out."""
    from attnviz.stats import HeadStats, depth_trend

    distance = np.array([[90.0, 80.0, np.nan], [12.0, 70.0, 60.0], [50.0, 110.0, 40.0], [30.0, np.nan, 20.0]])
    stats = HeadStats(np.zeros((4, 3)), distance, np.zeros((4, 3)), 197, 14.0, 101.9)
    trend = depth_trend(stats)
    assert trend.local == (1, 0, 12.0) and trend.far == (2, 1, 110.0)
    assert trend.half == 2 and trend.num_layers == 4
    assert trend.first_half == pytest.approx((90 + 80 + 12 + 70 + 60) / 5)
    assert trend.second_half == pytest.approx((50 + 110 + 40 + 30 + 20) / 5)
    one = depth_trend(HeadStats(np.zeros((1, 2)), np.array([[5.0, 7.0]]), np.zeros((1, 2)), 17, 8.0, 10.0))
    assert one.half == 0 and np.isnan(one.first_half) and one.second_half == 6.0


def test_concentration_of_hand_made_maps():
    from attnviz.stats import DIFFUSE_BELOW, concentration

    even = concentration(np.ones((14, 14)))
    assert (even.top_cells, even.cells) == (20, 196)  # ⌈19.6⌉ cells
    assert even.top == pytest.approx(20 / 196) == pytest.approx(even.even) and even.diffuse
    one = np.zeros((14, 14))
    one[3, 4] = 0.5
    assert concentration(one).top == 1.0 and not concentration(one).diffuse
    # 20 cells: the brightest 2 hold (5 + 4) of 5 + 4 + 18 · 1 = 27.
    ramp = np.ones((4, 5))
    ramp[0, 0], ramp[2, 3] = 5, 4
    assert concentration(ramp).top == pytest.approx(9 / 27)
    assert concentration(ramp).diffuse == (9 / 27 < DIFFUSE_BELOW)
    with pytest.raises(ValueError):
        concentration(np.zeros((2, 2)))


def spread_capture(sharpness: float) -> attnviz.Capture:
    """One layer, two heads over 14 × 14 patches: the class token's logits rise by ``sharpness`` towards the top-left
    corner of the grid (0: an even map)."""
    grid, d = 14, 1
    n = 1 + grid * grid
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    closeness = torch.tensor(-(rows + cols) / (2 * grid - 2), dtype=torch.float32)  # 0 at (0, 0), −1 at the far corner
    query, key = torch.zeros(1, 2, n, d), torch.zeros(1, 2, n, d)
    query[0, :, 0, 0] = 1.0
    key[0, :, 1:, 0] = sharpness * closeness
    return attnviz.Capture.of_tokens(query, key, 1.0, (grid, grid), 1, torch.zeros(1, 3, 196, 196), torch.zeros(1, 4))


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_the_reading_note_calls_a_diffuse_map_diffuse_with_its_own_number(lang, monkeypatch):
    import streamlit as st

    from attnviz import i18n, stats
    from attnviz_app.views.cls import spread_sentence

    monkeypatch.setitem(st.session_state, "lang", lang)
    diffuse, focused = spread_capture(0.0).summary_map(0, "mean"), spread_capture(30.0).summary_map(0, "mean")
    low, high = stats.concentration(diffuse), stats.concentration(focused)
    assert low.top == pytest.approx(20 / 196, abs=1e-6) and high.top > 0.9  # constructed far from the threshold
    said = spread_sentence(diffuse)
    assert said == i18n.text(lang, "view.reading_diffuse", top_cells=20, cells=196, top=low.top, even=20 / 196,
                             limit=stats.DIFFUSE_BELOW)
    assert "10.2%" in said and "25%" in said  # the capture's own share, an even map's, and the threshold
    other = spread_sentence(focused)
    assert other == i18n.text(lang, "view.reading_focused", top_cells=20, cells=196, top=high.top, even=20 / 196,
                              limit=stats.DIFFUSE_BELOW)
    assert f"{high.top:.1%}" in other
    diffuse_start = i18n.catalogue(lang)["view.reading_diffuse"].split("{")[0]  # "This map is diffuse: its brightest "
    assert said.startswith(diffuse_start) and not other.startswith(diffuse_start)
