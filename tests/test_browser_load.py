"""Browser sessions on one server upload different photos at the same time; each gets its own heatmap.

Three sessions in the default run, on the worker's shared page server; ``--slow`` runs eight on a server of their own
(tests/test_classroom_load.py, also ``--slow``, runs thirty)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import render
from serve import chromium, require_chromium, streamlit_server

from make_corpus import encode, photo, quadrants

from conftest import ASSETS
HEATMAP = "[data-testid='stImage'] img"
PORT = 8641
THREE = ("cat.jpg", "rocket.jpg", "stripes.png")  # the short run's: a photo, another, a made PNG


def eight_photos() -> list[tuple[str, bytes]]:
    real = [(f, (ASSETS / f).read_bytes()) for f in ("cat.jpg", "coffee.jpg", "astronaut.jpg", "rocket.jpg")]
    made = [
        ("gradient.png", encode(photo(300, 200, seed=1), "PNG")),
        ("quadrants.png", encode(quadrants(240, 240), "PNG")),
        ("stripes.png", encode(Image.fromarray(np.tile(((np.arange(256) // 16) % 2 * 255).astype(np.uint8),
                                                       (256, 1))).convert("RGB"), "PNG")),
        ("disc.jpg", encode(photo(400, 300, seed=7).transpose(Image.Transpose.FLIP_LEFT_RIGHT), "JPEG", quality=92)),
    ]
    return real + made


def expected_heatmap(model: attnviz.Model, data: bytes) -> np.ndarray:
    """The overlay the page draws by default (last layer, mean of heads, crop, inferno, α 0.6), as floats."""
    from attnviz.images import open_image

    checked = open_image(data)
    cap = attnviz.capture(model, checked.image)
    picture = render.overlay(model.view(checked.image), cap.cls_map(cap.num_layers - 1, "mean"))
    return np.asarray(picture, dtype=np.float32)


def open_upload(context, url: str, page=None):
    """A page on ``url`` with the "Upload a photo" input chosen (``page`` may already be loading ``url``)."""
    if page is None:
        page = context.new_page()
        page.goto(url)
    page.get_by_text("Upload a photo", exact=True).click(timeout=120_000)
    page.locator("input[type=file]").wait_for(state="attached", timeout=60_000)
    return page


def shown_heatmap(page, url: str, size: int) -> np.ndarray:
    """The page's first image, fetched from the server and scaled back to the model's S × S view."""
    page.wait_for_function("s => { const i = document.querySelector(s); return i && i.complete; }",
                           arg=HEATMAP, timeout=180_000)
    src = page.locator(HEATMAP).first.get_attribute("src")
    body = page.context.request.get(src if src.startswith(("http", "data:")) else url + src).body()
    picture = Image.open(io.BytesIO(body)).convert("RGB")
    return np.asarray(picture.resize((size, size), Image.Resampling.BOX), dtype=np.float32)


@pytest.fixture
def server(request):
    """(url, process): the worker's shared page server for the short run, a fresh one of its own for the long; either
    skips where Debian's chromium is missing, before a server starts."""
    if request.param == "shared":
        yield request.getfixturevalue("page_server"), None
    else:
        require_chromium()
        with streamlit_server(PORT) as (url, proc):
            yield url, proc


@pytest.mark.browser
@pytest.mark.parametrize(("sessions", "server"), [
    (3, "shared"), pytest.param(8, "own", marks=pytest.mark.slow),
], ids=["three", "eight"], indirect=["server"])
def test_sessions_uploading_at_once_each_get_their_own_heatmap(real_model, sessions, server):
    photos = [p for p in eight_photos() if sessions == 8 or p[0] in THREE]
    expected = [expected_heatmap(real_model, data) for _, data in photos]
    url, proc = server
    with chromium() as browser:
        contexts = [browser.new_context(viewport={"width": 1300, "height": 1000}) for _ in range(sessions)]
        loading = [c.new_page() for c in contexts]
        for page in loading:  # the front ends load side by side
            page.goto(url, wait_until="commit")
        pages = [open_upload(c, url, page) for c, page in zip(contexts, loading)]
        for page, (name, data) in zip(pages, photos):  # every upload leaves before any heatmap is back
            mime = "image/png" if name.endswith(".png") else "image/jpeg"
            page.locator("input[type=file]").set_input_files(files=[{"name": name, "mimeType": mime, "buffer": data}])
        shown = [shown_heatmap(page, url, real_model.size) for page in pages]
        for page in pages:
            assert page.locator("[data-testid='stException']").count() == 0
            assert page.locator("[data-testid='stAlertContentError']").count() == 0
        assert proc is None or proc.poll() is None
    for i, got in enumerate(shown):
        distances = [float(np.abs(got - want).mean()) for want in expected]
        print(f"{photos[i][0]}: mean |Δ| to own heatmap {distances[i]:.2f}, nearest other "
              f"{min(d for j, d in enumerate(distances) if j != i):.2f}")
        assert distances[i] < 2.0  # same picture up to JPEG transport
        assert int(np.argmin(distances)) == i  # and not somebody else's
