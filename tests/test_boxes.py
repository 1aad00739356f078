"""Where a map lands: a box carried onto the patches, the share of a map inside it, and the page's measured default."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

import attnviz
from attnviz import boxes, photos
from attnviz_app import settings
from conftest import tiny_vit


def test_coverage_counts_a_partly_covered_patch_by_its_covered_fraction():
    # 2 × 2 patches of 14 px; the box covers the right half of patch (0, 0) and the left half of (0, 1).
    cover = boxes.coverage(boxes.Box(7, 0, 21, 14), (2, 2), (28, 28))
    np.testing.assert_allclose(cover, [[0.5, 0.5], [0, 0]])
    # A box beyond the picture is clipped to it; one corner of a patch: a quarter.
    np.testing.assert_allclose(boxes.coverage(boxes.Box(-50, -50, 7, 7), (2, 2), (28, 28)), [[0.25, 0], [0, 0]])


def test_inside_share_of_a_hand_made_map():
    grid_map = np.array([[0.4, 0.2], [0.3, 0.1]])
    cover = boxes.coverage(boxes.Box(7, 0, 21, 14), (2, 2), (28, 28))
    assert boxes.inside_share(grid_map, cover) == pytest.approx(0.5 * 0.4 + 0.5 * 0.2)  # the map sums to 1
    assert boxes.inside_share(2 * grid_map, cover) == pytest.approx(0.3)  # a share: the scale does not matter
    assert boxes.inside_share(np.ones((2, 2)), cover) == pytest.approx(cover.mean()) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        boxes.inside_share(np.zeros((2, 2)), cover)


def test_on_input_follows_resize_and_centre_crop_by_hand():
    # 400 × 200 at S = 100: the shorter side to 100, the longer to 200, the crop starts 50 px in.
    on = boxes.on_input(boxes.Box(100, 50, 300, 150), (400, 200), 100, "crop", 1.0)
    assert (on.left, on.top, on.right, on.bottom) == pytest.approx((0, 25, 100, 75))
    # timm's crop_pct 0.875 at 224: the shorter side to int(224 / 0.875) = 256, the crop starts 16 px in.
    on = boxes.on_input(boxes.Box(0, 0, 300, 300), (300, 300), 224, "crop", 0.875)
    assert (on.left, on.top, on.right, on.bottom) == pytest.approx((-16, -16, 240, 240))
    on = boxes.on_input(boxes.Box(100, 50, 300, 150), (400, 200), 100, "squash")
    assert (on.left, on.top, on.right, on.bottom) == pytest.approx((25, 25, 75, 75))


@pytest.mark.parametrize("fit", ["crop", "squash"])
@pytest.mark.parametrize("photo, box", [((900, 600), (300, 120, 660, 480)), ((600, 900), (100, 300, 420, 700))])
def test_coverage_matches_the_pixels_the_model_is_fed(fit, photo, box):
    """A white box on a black photo, through Model.view itself: each patch's brightness is its covered fraction."""
    model = tiny_vit()  # 32 px, 8 px patches, crop_pct 0.875, bicubic
    picture = Image.new("RGB", photo)
    ImageDraw.Draw(picture).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=(255, 255, 255))
    seen = np.asarray(model.view(picture, fit).convert("L"), dtype=np.float64) / 255
    bright = seen.reshape(4, 8, 4, 8).mean((1, 3))  # (4, 4): each patch's share of white
    on = boxes.on_input(boxes.Box(*box), photo, 32, fit, model.data_config["crop_pct"])
    np.testing.assert_allclose(boxes.coverage(on, (4, 4), (32, 32)), bright, atol=0.02)  # measured ≤ 0.003


def test_box_share_of_a_constructed_capture():
    """Head 0 looks evenly (zero query), head 1 only at patch (0, 0); the box holds patch (0, 0) and half of (0, 1)."""
    n, d = 5, 2  # the class token and 2 × 2 patches
    query, key = torch.zeros(1, 2, n, d), torch.zeros(1, 2, n, d)
    query[0, 1, 0, 0] = 1.0
    key[0, 1, 1, 0] = 100.0  # token 1 = patch (0, 0): e^(100 · scale) outweighs everything
    cap = attnviz.Capture.of_tokens(query, key, 1.0, (2, 2), 1, torch.zeros(1, 3, 28, 28), torch.zeros(1, 4))
    cover = boxes.coverage(boxes.Box(0, 0, 21, 14), (2, 2), (28, 28))
    np.testing.assert_allclose(cover, [[1, 0.5], [0, 0]])
    share = boxes.box_share(cap, 0, cover)
    np.testing.assert_allclose(share.heads, [1.5 / 4, 1.0], atol=1e-6)  # float32 weights
    # Mean of heads over the patches: (0.2 + 1) / 2 on patch (0, 0), 0.1 on the others; 0.9 in all.
    assert share.mean == pytest.approx((0.6 + 0.5 * 0.1) / 0.9, abs=1e-6)
    assert share.baseline == pytest.approx(0.375)
    assert share.lift == pytest.approx(share.mean / 0.375)
    assert share.gain == pytest.approx((share.mean - 0.375) / 0.625)


def measured(photo: str, layer: int, share: float, baseline: float, size: int = 196) -> boxes.Measured:
    return boxes.Measured(photo, size, 12, boxes.BoxShare(layer, share, np.array([share]), baseline), 0.3)


def test_the_pick_is_the_largest_gain_in_the_final_layers():
    rows = [
        measured("big", 11, 0.8, 0.5),  # gain 0.6, lift 1.6
        measured("small", 10, 0.3, 0.05),  # gain 0.26, lift 6: the lift alone would pick the small box
        measured("early", 4, 0.99, 0.5),  # gain 0.98, but layer 5 of 12 is not in the last third
        measured("other size", 11, 0.99, 0.5, size=448),
    ]
    assert [l + 1 for l in boxes.final_layers(12)] == [9, 10, 11, 12]
    assert boxes.pick_default(rows, 196).photo == "big"
    assert boxes.pick_default(rows, 448).photo == "other size"
    with pytest.raises(ValueError):
        boxes.pick_default(rows, 224)


def test_the_sample_boxes_lie_inside_their_photos():
    found = boxes.sample_boxes()
    assert set(found) == set(photos.SAMPLES)
    for name, box in found.items():
        w, h = Image.open(photos.sample(name)).size
        assert 0 <= box.left < box.right <= w and 0 <= box.top < box.bottom <= h, name
        assert box.holds


def test_the_page_opens_on_the_measured_pick(real_model):
    """The Explore page's first photo and first layer (the last) are what bench.defaults picks at its first size,
    and there the map puts 0.728 of its weight in the cup's box, against 0.429 for an even map."""
    from bench.defaults import measure

    assert real_model.size == settings.DEFAULT_SIZES[0]
    pick = boxes.pick_default(measure(real_model), real_model.size)
    assert (pick.photo, pick.share.layer) == (settings.DEFAULT_PHOTO, real_model.depth - 1)
    assert pick.share.mean == pytest.approx(0.728, abs=0.01) and pick.share.baseline == pytest.approx(0.429, abs=0.002)
    assert pick.share.gain > 0.5
