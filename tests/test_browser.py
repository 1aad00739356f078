"""The real page in a real browser: upload a photo, see the heatmap, switch layer and head."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import render
from attnviz.images import open_image
from conftest import ASSETS
from serve import choose_option, chromium, download, require_chromium, shot, streamlit_server

HEATMAP = "[data-testid='stImage'] img"


@pytest.fixture(scope="module")
def server():
    require_chromium()
    with streamlit_server() as (url, _proc):
        yield url


def heatmap_src(page) -> str:
    return page.locator(HEATMAP).first.get_attribute("src")


def wait_for_new_heatmap(page, old: str) -> str:
    page.wait_for_function(
        "([sel, old]) => { const i = document.querySelector(sel); return i && i.src !== old && i.complete; }",
        arg=[HEATMAP, old], timeout=60_000,
    )
    return heatmap_src(page)


@pytest.mark.browser
def test_upload_then_switch_layer_and_head(server, real_model):
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(server)
        # the server's first run imports torch and timm for seconds: the page says so instead of staying blank
        page.get_by_text("Starting attnviz: loading PyTorch").wait_for(timeout=20_000)
        page.get_by_text("Upload a photo", exact=True).click(timeout=120_000)
        assert page.get_by_text("Starting attnviz").count() == 0
        page.locator("input[type=file]").set_input_files(str(ASSETS / "coffee.jpg"))
        page.wait_for_selector(HEATMAP, timeout=120_000)
        page.wait_for_function("s => document.querySelector(s).complete", arg=HEATMAP)
        first = heatmap_src(page)
        assert page.get_by_text("Layer 12, mean of all heads: where the class token looks").is_visible()
        shot(page, "upload", full_page=True)

        # Layer: the slider thumb takes arrow keys like any slider
        page.get_by_role("slider", name="Layer").focus()
        for _ in range(4):
            page.keyboard.press("ArrowLeft")
        second = wait_for_new_heatmap(page, first)
        page.get_by_text("Layer 8, mean of all heads", exact=False).wait_for()

        # Head: open the select box and pick head 3
        choose_option(page, ".st-key-head input", page.get_by_role("option", name="head 3", exact=True))
        third = wait_for_new_heatmap(page, second)
        page.get_by_text("Layer 8, head 3: where the class token looks").wait_for()
        assert len({first, second, third}) == 3
        assert page.locator("[data-testid='stException']").count() == 0
        shot(page, "layer8_head3", full_page=True)

        # A new upload keeps the chosen Layer and Head (Streamlit once forgot them on the way)
        page.locator("input[type=file]").set_input_files(str(ASSETS / "rocket.jpg"))
        wait_for_new_heatmap(page, third)
        page.get_by_text("rocket.jpg").wait_for()
        page.get_by_text("Layer 8, head 3: where the class token looks").wait_for()

        # The download button hands over exactly the picture on the page (encoded only on the click)
        saved = download(page, page.get_by_role("button", name="Download this picture (PNG)"))
        assert saved.suggested_filename == "attention_layer8_head3.png"
        got = np.asarray(Image.open(io.BytesIO(Path(saved.path()).read_bytes())).convert("RGB"), dtype=np.int16)
        image = open_image((ASSETS / "rocket.jpg").read_bytes()).image
        cap = attnviz.capture(real_model, image)
        want = render.enlarge(render.overlay(real_model.view(image), cap.cls_map(7, 2)), 448)
        assert got.shape == (want.height, want.width, 3)
        assert np.abs(got - np.asarray(want, dtype=np.int16)).max() <= 2  # same maps; float rounding at most
