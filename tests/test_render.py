"""Maps → pixels on hand-made maps with known pictures."""
from __future__ import annotations

import matplotlib
import numpy as np
from PIL import Image

from attnviz import render


def test_nearest_upsampling_makes_flat_patches():
    m = np.array([[0.0, 1.0], [2.0, 3.0]])
    up = render.upsample(m, (4, 4))
    np.testing.assert_array_equal(up, [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]])


def test_smooth_upsampling_keeps_a_constant_map_constant():
    np.testing.assert_allclose(render.upsample(np.full((3, 3), 0.25), (9, 9), smooth=True), 0.25, atol=1e-6)


def test_normalise_and_colorize_ends():
    unit = render.normalise(np.array([2.0, 3.0, 4.0]))
    np.testing.assert_allclose(unit, [0.0, 0.5, 1.0])
    assert render.normalise(np.full(3, 7.0)).tolist() == [0, 0, 0]
    rgb = render.colorize(np.array([0.0, 1.0]), "viridis")
    expected = (np.array(matplotlib.colormaps["viridis"]([0.0, 1.0]))[:, :3] * 255 + 0.5).astype(np.uint8)
    np.testing.assert_array_equal(rgb, expected)


def test_overlay_blends_photo_and_heat():
    photo = Image.new("RGB", (4, 4), (100, 100, 100))
    m = np.array([[0.0, 1.0], [0.0, 1.0]])
    assert np.asarray(render.overlay(photo, m, alpha=0.0)).tolist() == np.asarray(photo).tolist()
    full = np.asarray(render.overlay(photo, m, alpha=1.0, cmap="gray"))
    assert full[0, 0].tolist() == [0, 0, 0] and full[0, 3].tolist() == [255, 255, 255]
    half = np.asarray(render.overlay(photo, m, alpha=0.5, cmap="gray"))
    assert half[0, 3].tolist() == [178, 178, 178]  # (100 + 255) / 2 = 177.5, rounded


def test_colorbar_runs_low_to_high():
    bar = np.asarray(render.colorbar("gray", width=8, height=2))
    assert bar.shape == (2, 8, 3) and bar[0, 0, 0] == 0 and bar[0, -1, 0] == 255


def test_enlarge_by_whole_factors_and_outline_a_cell():
    small = Image.new("RGB", (14, 10), (10, 20, 30))
    big = render.enlarge(small, side=40)
    assert big.size == (42, 30) and big.getpixel((41, 29)) == (10, 20, 30)  # factor 3, nearest
    framed = np.asarray(render.outline(Image.new("RGB", (8, 8)), (2, 2), [(1, 0, (255, 0, 0))], width=1))
    assert framed[4, 0].tolist() == [255, 0, 0] and framed[7, 3].tolist() == [255, 0, 0]  # cell (1, 0) edges
    assert framed[5, 2].tolist() == [0, 0, 0] and framed[0, 0].tolist() == [0, 0, 0]  # inside and other cells
