"""DINO-style mass masks on hand-made maps."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from attnviz.masks import draw_mask, mass_mask


def test_smallest_set_holding_the_mass():
    grid = np.array([[0.4, 0.1], [0.3, 0.2]])
    m = mass_mask(grid, 0.6)  # 0.4 alone is too little; 0.4 + 0.3 = 0.7 is enough
    np.testing.assert_array_equal(m.keep, [[True, False], [True, False]])
    assert m.count == 2 and m.mass == pytest.approx(0.7)
    assert mass_mask(grid, 0.4).count == 1  # reaching the mass exactly is enough
    assert mass_mask(grid, 0.95).count == 4
    # unnormalised maps give the same answer: the mass is relative to the map's total
    np.testing.assert_array_equal(mass_mask(grid * 37.0, 0.6).keep, m.keep)


def test_ties_break_in_raster_order_and_default_is_60_percent():
    m = mass_mask(np.ones((2, 3)))  # six equal cells: 60 % needs 4 of them (3 would be 50 %)
    np.testing.assert_array_equal(m.keep, [[True, True, True], [True, False, False]])
    assert m.mass == pytest.approx(4 / 6)


def test_bad_inputs():
    with pytest.raises(ValueError):
        mass_mask(np.array([[0.5, -0.1]]))
    with pytest.raises(ValueError):
        mass_mask(np.ones((2, 2)), 0.0)


def test_draw_mask_darkens_outside_and_outlines():
    view = Image.new("RGB", (32, 32), (200, 100, 50))
    keep = np.zeros((4, 4), dtype=bool)
    keep[0, 0] = True  # the top-left 8 × 8 px patch
    out = np.asarray(draw_mask(view, keep, dim=0.5, colour=(0, 255, 255)))
    assert tuple(out[3, 3]) == (200, 100, 50)  # inside: untouched
    assert tuple(out[20, 20]) == (100, 50, 25)  # outside: half as bright
    assert tuple(out[3, 8]) == (0, 255, 255) and tuple(out[8, 3]) == (0, 255, 255)  # on the edge
