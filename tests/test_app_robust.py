"""The page over the corpus (AppTest, real upload widget): a heatmap or exactly one error sentence, never a traceback."""
from __future__ import annotations

import re


import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import render

from make_corpus import entries

from conftest import APP
CORPUS = entries()
BY_NAME = {e.name: e for e in CORPUS}


@pytest.fixture(scope="module")
def page():
    """One browser session on the upload input, reused by every test (as one student would)."""
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.radio(key="source").set_value("upload").run()
    assert not at.exception
    return at


@pytest.fixture
def overlays(monkeypatch):
    """Every (h, w) map the page lays on a picture during one run, in order."""
    seen: list[np.ndarray] = []
    original = render.overlay

    def spy(view, grid_map, *args, **kwargs):
        seen.append(np.array(grid_map))
        return original(view, grid_map, *args, **kwargs)

    monkeypatch.setattr(render, "overlay", spy)
    return seen


def upload(at: AppTest, name: str, data: bytes) -> AppTest:
    at.file_uploader(key="upload").set_value((name, data, "application/octet-stream"))
    return at.run()


def expected_map(model: attnviz.Model, data: bytes) -> np.ndarray:
    """The library's map for ``data``: the page must decode and preprocess exactly as the library does."""
    cap = attnviz.capture(model, attnviz.read_photo(data, model).image, fit="crop")
    return cap.cls_map(cap.num_layers - 1, "mean")  # the page's defaults: last layer, mean of heads


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("entry", CORPUS, ids=[e.name for e in CORPUS])
def test_each_file_gives_a_heatmap_or_one_sentence(page, overlays, real_model, entry):
    at = upload(page, entry.name, entry.data)
    assert not at.exception, [e.value for e in at.exception]
    if not entry.ok:
        shown = re.sub(r"\\(.)", r"\1", at.error[0].value)  # the Markdown source, escapes removed
        assert len(at.error) == 1 and entry.matches(shown)
        assert shown.startswith(entry.name)
        assert not at.image and not overlays
        return
    assert not at.error, [e.value for e in at.error]
    assert at.image and overlays, "no heatmap on the page"
    assert overlays[0].shape == real_model.grid
    np.testing.assert_allclose(overlays[0], expected_map(real_model, entry.data), rtol=1e-5, atol=1e-7)
    if entry.expect:  # e.g. "first of 3 frames" or "white background": the page says so
        assert any(entry.matches(i.value) for i in at.info), [i.value for i in at.info]


def test_good_upload_after_bad_ones_still_works(page, overlays, real_model):
    sequence = ["bomb_60000.png", "eight.png", "truncated.png", "empty.jpg", "exif_orientation_8.jpg", "noise.jpg",
                "cmyk.jpg"]
    for name in sequence:
        overlays.clear()
        at = upload(page, name, BY_NAME[name].data)
        assert not at.exception
        if BY_NAME[name].ok:
            assert not at.error and len(overlays) >= 1
            np.testing.assert_allclose(overlays[0], expected_map(real_model, BY_NAME[name].data), rtol=1e-5, atol=1e-7)
        else:
            assert len(at.error) == 1


def test_clearing_the_upload_goes_back_to_waiting(page):
    upload(page, "cmyk.jpg", BY_NAME["cmyk.jpg"].data)
    page.file_uploader(key="upload").clear()
    at = page.run()
    assert not at.exception and not at.error and not at.image
    assert len(at.info) == 1  # "waiting for a photo"
