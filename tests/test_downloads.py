"""The download buttons' pictures, drawn when clicked from the numbers the run left (``Context.deferred``):
the same picture as a fresh drawing from a fresh capture, and never the capture held by the button."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import attnviz
from attnviz import render
from attnviz.masks import draw_mask, mass_mask
from attnviz_app.views import Context
from attnviz_app.views import cls, heads, mask, query, rollout

LAYER, HEAD = 7, 2


@pytest.fixture(scope="module")
def drawn(real_model, cat):
    cap = attnviz.capture(real_model, cat)
    return real_model, cap, real_model.view(cat)


def context(model, cap, view, head=HEAD):
    return Context(model=model, cap=cap, view=view, layer=LAYER, head=head, alpha=0.6, cmap="inferno", smooth=False,
                   fit="crop")


def pixels(picture) -> np.ndarray:
    return np.asarray(picture.convert("RGB"), dtype=np.int16)


def test_a_download_holds_no_capture_and_draws_what_a_fresh_capture_draws(real_model, cat):
    cap = attnviz.capture(real_model, cat)
    ctx = context(real_model, cap, real_model.view(cat))

    class Recall:  # as ui.Recall once the capture has left the cache: computed again from the photo
        def capture(self):
            return attnviz.capture(real_model, cat)

        def view(self):
            return real_model.view(cat)

    ctx = Context(**{**ctx.__dict__, "recall": Recall()})
    download = ctx.deferred(cls.picture_of, LAYER, HEAD, 0.6, "inferno", False)
    gone = weakref.ref(cap)
    del cap, ctx
    gc.collect()
    assert gone() is None  # the button's function kept numbers and the means to compute again, not the capture
    again = attnviz.capture(real_model, cat)
    want = render.enlarge(render.overlay(real_model.view(cat), again.cls_map(LAYER, HEAD)), 448)
    got = download()
    assert got.size == want.size
    assert np.abs(pixels(got) - pixels(want)).max() <= 2  # high-norm marks aside, the same overlay


def test_the_query_download_is_that_token_s_row(drawn):
    model, cap, view = drawn
    query_token = cap.num_prefix_tokens + 3 * cap.grid[1] + 5
    got = context(model, cap, view).deferred(query.picture_of, LAYER, HEAD, query_token, 0.6, "inferno", False)()
    row = cap.layer_weights(LAYER)[HEAD, query_token, cap.num_prefix_tokens:].numpy().reshape(cap.grid)
    want = render.enlarge(render.overlay(view, row), 448)
    assert got.size == want.size
    centre = (slice(32 * 3 + 8, 32 * 3 + 24), slice(32 * 7 + 8, 32 * 7 + 24))  # a patch away from the framed query
    assert np.abs(pixels(got)[centre] - pixels(want)[centre]).max() <= 1


def test_the_heads_sheet_has_every_layer_and_head(drawn):
    model, cap, view = drawn
    sheet = context(model, cap, view).deferred(heads.sheet_of, 40, 0.6, "inferno", False, (LAYER, HEAD))()
    tiles = heads.tiles_of(cap, view, 40, 0.6, "inferno", False)
    assert len(tiles) == cap.num_layers and all(len(row) == cap.num_heads + 1 for row in tiles)
    assert sheet.width >= (cap.num_heads + 1) * 40 and sheet.height >= cap.num_layers * 40


def test_the_mask_downloads_keep_the_patches_the_page_counts(drawn):
    model, cap, view = drawn
    one = context(model, cap, view).deferred(mask.one_mask, LAYER, HEAD, 0.6)()
    want = render.enlarge(draw_mask(view, mass_mask(cap.summary_map(LAYER, HEAD), 0.6).keep), 448)
    assert np.array_equal(pixels(one), pixels(want))
    sheet = context(model, cap, view).deferred(mask.head_masks_sheet, LAYER, 0.6)()
    rows = -(-cap.num_heads // 3)
    assert sheet.size == (3 * (mask.THUMB_PX + 8), rows * (mask.THUMB_PX + 8))


def test_the_rollout_download_is_both_pictures_side_by_side(drawn):
    model, cap, view = drawn
    rolled = np.asarray(attnviz.rollout.rollout_map(cap, 0, cap.num_layers - 1, "mean", 0.0))
    args = (cap.num_layers, "mean", rolled, 0.6, "inferno", False)
    sheet = context(model, cap, view).deferred(rollout.sheet_of, *args)()
    left, right = rollout.pictures_of(cap, view, *args)
    assert sheet.size == (left.width + 12 + right.width, left.height)
    assert np.array_equal(pixels(sheet.crop((0, 0, left.width, left.height))), pixels(left))
