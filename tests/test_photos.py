"""One source of truth for preprocessing: phone photos (HEIC, AVIF, rotated 12 MP JPEG) decoded at the size
the model needs, identically through the library, the CLI and the page."""
from __future__ import annotations


import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import cli, photos
from attnviz.images import open_image

from make_corpus import QUADRANT_PROBES, encode, entries, photo

PHONE = {e.name: e for e in entries() if e.name in (
    "phone_12mp_rotated.jpg", "iphone_12mp_rotated.heic", "phone_rotated.avif", "photo.avif",
    "one_pixel.png", "strip.png", "panorama.jpg")}


def probe(image: Image.Image, x: float, y: float) -> tuple[int, ...]:
    return image.getpixel((min(int(x * image.width), image.width - 1), min(int(y * image.height), image.height - 1)))


def test_decode_side_is_twice_what_timms_resize_needs(real_model, tiny):
    assert photos.decode_side(real_model) == 294  # 1.5 × 196 px (crop_pct 1.0)
    assert photos.decode_side(tiny) == int(np.ceil(1.5 * np.ceil(32 / tiny.data_config["crop_pct"])))


@pytest.mark.parametrize("name", ["phone_12mp_rotated.jpg", "iphone_12mp_rotated.heic", "phone_rotated.avif"])
def test_phone_photos_are_read_upright_at_the_size_the_model_needs(real_model, name):
    entry = PHONE[name]
    checked = attnviz.read_photo(entry.data, real_model, name)
    w, h = checked.image.size
    side = photos.decode_side(real_model)
    full_w, full_h = entry.size
    assert abs(w / h - full_w / full_h) < 0.01  # upright: landscape stays landscape after the EXIF turn
    if min(entry.size) >= 2 * side:
        assert side <= min(w, h) < 2 * side  # reduced, never below what the resize needs
    else:
        assert (w, h) == entry.size
    for (x, y), colour in QUADRANT_PROBES:
        assert max(abs(a - b) for a, b in zip(probe(checked.image, x, y), colour)) <= 40, (name, x, y)
    assert any("upright" in n for n in checked.notes)
    assert checked.format == {"jpg": "JPEG", "heic": "HEIC", "avif": "AVIF"}[name.rsplit(".", 1)[1]]


def test_reduced_decoding_changes_the_models_view_only_by_rounding(real_model):
    data = encode(photo(4000, 3000, seed=9), "JPEG", quality=92)
    reduced = attnviz.read_photo(data, real_model).image
    assert reduced.size == (500, 375)  # decoded at 1/8 scale straight from the DCT coefficients
    full = open_image(data).image
    a = np.asarray(real_model.view(reduced), dtype=np.float32)
    b = np.asarray(real_model.view(full), dtype=np.float32)
    assert np.abs(a - b).mean() < 1.0 and np.abs(a - b).max() < 16


def test_library_and_cli_feed_the_model_identical_pixels(real_model, tmp_path, monkeypatch):
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: real_model)
    for name in ("phone_12mp_rotated.jpg", "iphone_12mp_rotated.heic", "phone_rotated.avif"):
        path = tmp_path / name
        path.write_bytes(PHONE[name].data)
        assert cli.main(["export", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
        saved = np.load(tmp_path / "out" / f"{cli.safe_stem(name)}.npz")
        cap = attnviz.capture(real_model, attnviz.load_photo(path, real_model).image)
        assert np.array_equal(saved["input"], cap.input.numpy()), name
        np.testing.assert_allclose(saved["attention"][11].mean(0)[0], cap.weights(11, "mean")[0], atol=1e-6)


def test_a_large_photo_gives_the_same_weights_everywhere(real_model):
    """The issue's case: a 4000 px photo. Before, the page shrank it to 2048 px first and the CLI did not
    (weights 3e-3 apart). Both now call read_photo; recomputing from the bytes gives the same input."""
    data = encode(photo(4000, 3000, seed=11), "JPEG", quality=90)
    first = attnviz.capture(real_model, attnviz.read_photo(data, real_model).image)
    second = attnviz.capture(real_model, attnviz.read_photo(data, real_model, "again.jpg").image)
    assert np.array_equal(first.input.numpy(), second.input.numpy())


def test_the_decoded_photo_is_small_whatever_its_shape(real_model):
    side = photos.decode_side(real_model)
    for entry in (PHONE["panorama.jpg"], PHONE["iphone_12mp_rotated.heic"]):
        w, h = attnviz.read_photo(entry.data, real_model).image.size
        assert max(w, h) <= photos.LONGEST * side and w * h * 3 <= 8.3e6


def test_odd_pictures_get_a_note_on_how_the_model_sees_them(real_model):
    one = photos.view_notes((1, 1), real_model, "crop")
    assert [k for k, _ in one] == ["tiny"] and one[0][1]["grid_h"] == 14
    strip = photos.view_notes((60, 3000), real_model, "crop")
    assert strip == (("cropped", {"w": 60, "h": 3000, "percent": 2}),)
    assert photos.view_notes((60, 3000), real_model, "squash") == ()  # squash keeps all of it
    assert photos.view_notes((4032, 3024), real_model, "crop") == ()  # an ordinary photo: nothing to say
