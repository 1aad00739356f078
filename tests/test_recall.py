"""What a browser session keeps after its run: no capture (a class's sixty open tabs held one each, 0.5 GB of the
server), and downloads that still get theirs back when clicked (attnviz_app.ui.Recall)."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz_app import views, heavy, ui
from conftest import APP


def alive_captures() -> list[attnviz.Capture]:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, attnviz.Capture)]


def alive_pictures(min_pixels: int = 400 * 400) -> list[Image.Image]:
    """Pictures the size of what the page shows (588 px: ~1 MB each)."""
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, Image.Image) and o.width * o.height >= min_pixels]


@pytest.mark.parametrize("view", list(views.registered()))  # every view the registry finds, a new one too
def test_a_finished_run_leaves_no_capture_but_the_caches(view):
    ui.cached_capture.clear()
    before = {id(c) for c in alive_captures()}  # other tests' captures (session fixtures) are not the page's
    pictures_before = {id(p) for p in alive_pictures()}
    at = AppTest.from_file(str(APP), default_timeout=180).run()
    if view != "cls":
        at.selectbox(key="view").set_value(view).run()
    assert not at.exception and not at.error
    made = [weakref.ref(c) for c in alive_captures() if id(c) not in before]
    assert made, "the page's capture is in the server's cache"
    ui.cached_capture.clear()
    gc.collect()
    assert [r() for r in made if r() is not None] == []  # nothing of the session (widgets' functions, downloads) holds one
    heavy.shared_queue.clear()  # the server's shared results (e.g. the Q/K atlas's picture)
    # and its decoded photos: after another file's uploads had filled that cache, this run decoded the sample photo
    # again and the cache's copy (600 × 400) read as the session's
    ui.checked_image.clear()
    # nor the pictures it showed: a download button draws its picture again when clicked
    assert [p.size for p in alive_pictures() if id(p) not in pictures_before] == []


def test_a_recall_finds_the_cached_capture_and_computes_it_again_once_it_is_gone(real_model):
    data = attnviz.photos.sample("cat").read_bytes()
    key = (("offline", real_model.size), ui.digest(data), "crop")
    checked = ui.checked_image(key[1], attnviz.photos.decode_side(real_model), "cat.jpg", _data=data, _model=real_model)
    cap = ui.cached_capture(*key, _model=real_model, _image=checked)
    recall = ui.Recall(real_model, key, data, "cat.jpg", weakref.ref(cap))
    assert recall.capture() is cap
    layer = cap.layer_weights(11).numpy()
    del cap, checked
    ui.cached_capture.clear()
    ui.checked_image.clear()
    gc.collect()
    assert recall.captured() is None
    again = recall.capture()  # what a download clicked now gets: the same numbers, computed again
    reference = attnviz.capture(real_model, attnviz.read_photo(data, real_model).image)
    np.testing.assert_array_equal(again.layer_weights(11).numpy(), layer)
    np.testing.assert_allclose(again.layer_weights(11).numpy(), reference.layer_weights(11).numpy(), atol=1e-6)
    assert recall.view().size == (real_model.size, real_model.size)
