"""The self-contained page, opened from disk in headless Chromium with the network blocked; the notebook view;
the layer sweep GIF."""
from __future__ import annotations

import base64
import html as htmlmod
import io
import re

import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import cli, html, render, sweep
from conftest import ASSETS, tiny_vit
from serve import chromium, chromium_path, download, require_chromium

LIMIT_196 = 5_000_000  # bytes: the page at 196 px (issue #12)

needs_chromium = pytest.mark.skipif(chromium_path() is None, reason="Debian's chromium is not installed")


@pytest.fixture(scope="module")
def real_cap(real_model):
    return attnviz.capture(real_model, Image.open(ASSETS / "cat.jpg"))


@pytest.fixture(scope="module")
def real_page(real_cap, real_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("html") / "cat.html"
    path.write_text(html.page(real_cap, "en", source="cat.jpg", top=real_model.top_classes(real_cap.output)),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def browser():
    require_chromium()
    with chromium() as b:
        yield b


def open_offline(browser, path):
    """The page from disk, every request that is not a file: URL blocked and recorded."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    blocked, errors = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return context, page, blocked, errors


def pixels(page) -> np.ndarray:
    """The picture canvas as (S, S, 3) uint8."""
    data = page.evaluate("""() => {
        const c = document.getElementById('picture');
        return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data);
    }""")
    side = int(round((len(data) // 4) ** 0.5))
    return np.array(data, dtype=np.uint8).reshape(side, side, 4)[..., :3]


def patch_centre(page, row, col, grid):
    box = page.locator("#picture").bounding_box()
    return box["x"] + (col + 0.5) * box["width"] / grid[1], box["y"] + (row + 0.5) * box["height"] / grid[0]


def test_page_size_at_196_px(real_page):
    assert real_page.stat().st_size <= LIMIT_196
    text = real_page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # no external URL anywhere
    assert "http://" not in text and "https://" not in text


@needs_chromium
def test_layer_head_and_a_patch_click_change_the_picture_and_numbers_are_exact(browser, real_page, real_cap):
    cap = real_cap
    context, page, blocked, errors = open_offline(browser, real_page)
    try:
        assert blocked == [] and errors == []
        # real <label for> elements tied to the inputs
        layer, head = page.get_by_label("Layer", exact=True), page.get_by_label("Head", exact=True)
        assert layer.get_attribute("type") == "range" and head.evaluate("e => e.tagName") == "SELECT"
        start = pixels(page)
        # the first picture is exactly render.overlay of the class token's map (last layer, mean of heads)
        expected = np.asarray(render.overlay(cap.prepared.picture(cap.input), cap.cls_map(11, "mean")))
        assert np.abs(start.astype(int) - expected).max() <= 1

        layer.focus()
        page.keyboard.press("ArrowLeft")  # keyboard: layer 12 → 11
        assert page.locator("#layer-value").inner_text() == "11"
        after_layer = pixels(page)
        assert np.abs(after_layer.astype(int) - start).mean() > 1
        expected = np.asarray(render.overlay(cap.prepared.picture(cap.input), cap.cls_map(10, "mean")))
        assert np.abs(after_layer.astype(int) - expected).max() <= 1

        head.select_option(label="head 3")
        after_head = pixels(page)
        assert np.abs(after_head.astype(int) - after_layer).mean() > 1

        page.mouse.click(*patch_centre(page, 5, 9, cap.grid))  # query = patch (row 6, col 10)
        query = cap.num_prefix_tokens + 5 * cap.grid[1] + 9
        assert page.locator("#picture").get_attribute("data-query") == str(query)
        after_click = pixels(page)
        assert np.abs(after_click.astype(int) - after_head).mean() > 1
        assert "patch (row 6, column 10)" in page.locator("#caption").inner_text()

        weights = cap.weights(10, 2)  # (N, N): layer 11, head 3
        for row, col in [(0, 0), (7, 3), (13, 13), (5, 9)]:
            page.mouse.move(*patch_centre(page, row, col, cap.grid))
            readout = page.locator("#readout")
            key = cap.num_prefix_tokens + row * cap.grid[1] + col
            assert readout.get_attribute("data-key") == str(key)
            shown, tol = float(readout.get_attribute("data-value")), float(readout.get_attribute("data-tolerance"))
            row_patches = weights[query, cap.num_prefix_tokens:]
            assert tol == pytest.approx((row_patches.max() - row_patches.min()) / 510, rel=1e-5)
            assert abs(shown - weights[query, key]) <= tol * (1 + 1e-5) + 1e-9
            # the sentence a person reads: the same number, rounded no further than its ±
            text_value, text_tol = re.search(r": ([0-9.]+) ± ([0-9.]+)$", readout.inner_text()).groups()
            assert abs(float(text_value) - weights[query, key]) <= float(text_tol) * 1.1 + 1e-12

        page.locator("#reset").click()  # back to the class token
        assert page.locator("#picture").get_attribute("data-query") == "summary"
        page.locator("#picture").focus()  # keyboard on the picture: move, Enter picks
        page.keyboard.press("ArrowRight")
        page.keyboard.press("Enter")
        assert page.locator("#picture").get_attribute("data-query") == str(
            cap.num_prefix_tokens + 7 * cap.grid[1] + 8)
        page.keyboard.press("Escape")
        assert page.locator("#picture").get_attribute("data-query") == "summary"
        page.get_by_label("With a mouse: hovering a patch makes it the query").check()  # now the pointer is the query
        page.mouse.move(*patch_centre(page, 2, 3, cap.grid))
        assert page.locator("#picture").get_attribute("data-query") == str(cap.num_prefix_tokens + 2 * cap.grid[1] + 3)
        assert blocked == [] and errors == []
    finally:
        context.close()


@needs_chromium
def test_chinese_page_and_the_reduced_mode(browser, tmp_path):
    cap = attnviz.capture(tiny_vit(), Image.open(ASSETS / "cat.jpg"))
    path = tmp_path / "tiny.html"
    path.write_text(html.page(cap, "zh-TW", all_rows=False), encoding="utf-8")
    context, page, blocked, errors = open_offline(browser, path)
    try:
        assert page.evaluate("document.documentElement.lang") == "zh-TW"
        assert page.get_by_label("層", exact=True).get_attribute("type") == "range"
        assert page.get_by_label("注意力頭", exact=True).evaluate("e => e.tagName") == "SELECT"
        assert page.locator("#reduced").is_visible() and "N = 17" in page.locator("#reduced").inner_text()
        before = pixels(page)
        page.mouse.click(*patch_centre(page, 1, 1, cap.grid))  # only the class token's rows: nothing changes
        assert page.locator("#picture").get_attribute("data-query") == "summary"
        assert np.array_equal(pixels(page), before)
        assert blocked == [] and errors == []
    finally:
        context.close()


def test_all_rows_only_while_they_fit():
    cap = attnviz.capture(tiny_vit(), Image.open(ASSETS / "cat.jpg"))
    assert html.all_rows_bytes(cap) == 2 * 7 * 17 * 16
    assert html.payload(cap)[1].keys() >= {"rows", "rows_lo", "rows_hi", "summary"}
    # the offline ViT-S/14 at 518 px: 12 · 9 · 1370 · 1369 bytes of rows would not fit; 224 px does
    assert 12 * 9 * 1370 * 1369 > html.ALL_ROWS_BYTES >= 12 * 9 * 257 * 256


def test_repr_html_is_the_same_page_and_repr_is_one_line():
    cap = attnviz.capture(tiny_vit(), Image.open(ASSETS / "cat.jpg"))
    shown = cap._repr_html_()
    srcdoc = re.fullmatch(r'<iframe srcdoc="([^"]*)".*</iframe>', shown, flags=re.S).group(1)
    assert htmlmod.unescape(srcdoc) == html.page(cap)
    assert attnviz.show(cap).html == html.page(cap)  # outside IPython, show() hands the page back
    line = repr(cap)
    assert "\n" not in line and len(line) < 200
    assert line == "Capture(tiny, 2 layers × 4 heads, N = 17 (1 prefix + 4×4 patches), d_k = 8, 0.0 MB)"


def test_the_photo_in_the_page_is_the_one_the_model_saw(real_cap, real_model, real_page):
    src = re.search(r'id="photo" alt="" hidden src="data:image/png;base64,([^"]+)"', real_page.read_text()).group(1)
    embedded = np.asarray(Image.open(io.BytesIO(base64.b64decode(src))).convert("RGB"))
    seen = np.asarray(real_model.view(Image.open(ASSETS / "cat.jpg")))
    assert np.array_equal(embedded, seen)


def test_layer_sweep_has_every_layer_in_order():
    model = tiny_vit(seed=3)
    cap = attnviz.capture(model, Image.open(ASSETS / "coffee.jpg"))
    data = sweep.sweep_gif(cap)
    gif = Image.open(io.BytesIO(data))
    assert gif.n_frames == cap.num_layers and gif.info["loop"] == 0
    frames = sweep.frame_arrays(data)
    view = cap.prepared.picture(cap.input)
    expected = [np.asarray(render.overlay(view, cap.cls_map(layer, "mean"))).astype(int)
                for layer in range(cap.num_layers)]
    scale = frames[0].shape[1] // view.width
    for i, frame in enumerate(frames):
        picture = frame[::scale, ::scale][: view.height].astype(int)
        distances = [np.abs(picture - e).mean() for e in expected]
        assert int(np.argmin(distances)) == i and distances[i] < 3  # its own layer, up to GIF's palette


def test_cli_writes_html_and_gif(tmp_path, monkeypatch, capsys):
    model = tiny_vit()
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: model)
    out = tmp_path / "out"
    code = cli.main(["export", str(ASSETS / "cat.jpg"), "--out", str(out), "--html", "--gif", "--lang", "zh-TW",
                     "--format", "qk", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["cat.html", "cat.npz", "cat_layers.gif", "cat_overlay.png"]
    page = (out / "cat.html").read_text(encoding="utf-8")
    assert '<html lang="zh-TW">' in page and "cat.jpg：Vision Transformer 在看哪裡" in page
    assert Image.open(out / "cat_layers.gif").n_frames == 2


@pytest.mark.browser
@needs_chromium
def test_page_downloads_the_interactive_page_and_the_sweep(browser, page_server, tmp_path, real_model, real_cap):
    """The real app: 'Download interactive page' gives this photo's page; the layer sweep has L frames."""
    page = browser.new_page(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
    page.goto(page_server)
    button = page.get_by_role("button", name="Download interactive page (HTML)")
    button.wait_for(timeout=120_000)
    got = download(page, button)
    saved = tmp_path / got.suggested_filename
    got.save_as(saved)
    assert saved.name == "attention_196px.html"
    text = saved.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and '<html lang="en">' in text and len(text.encode()) <= LIMIT_196
    assert "N = 197 = 1 prefix + 196 patches" in text and '<label for="layer">Layer</label>' in text
    # the sample shown first (the page's default photo), as the model saw it, and not another sample
    from attnviz_app.settings import DEFAULT_PHOTO

    src = re.search(r'id="photo" alt="" hidden src="data:image/png;base64,([^"]+)"', text).group(1)
    embedded = np.asarray(Image.open(io.BytesIO(base64.b64decode(src))).convert("RGB")).astype(int)
    off = {name: np.abs(embedded - np.asarray(real_model.view(Image.open(attnviz.photos.sample(name))))).mean()
           for name in attnviz.photos.SAMPLES}
    assert off[DEFAULT_PHOTO] < 3 and min(v for k, v in off.items() if k != DEFAULT_PHOTO) > 20, off
    got = download(page, page.get_by_role("button", name="Download the layer sweep (GIF)"))
    gif = Image.open(got.path())
    assert gif.n_frames == real_cap.num_layers
    page.close()


@needs_chromium
def test_notebook_view_runs_inside_its_iframe(browser, tmp_path):
    """What Jupyter shows for a capture: the iframe's page unpacks and draws (sandboxed, from srcdoc)."""
    cap = attnviz.capture(tiny_vit(), Image.open(ASSETS / "cat.jpg"))
    path = tmp_path / "notebook.html"
    path.write_text(f"<!doctype html><html><body><p>cell output</p>{cap._repr_html_()}</body></html>", encoding="utf-8")
    context = browser.new_context()
    try:
        page = context.new_page()
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "about:")) else r.abort())
        page.goto(path.as_uri())
        frame = page.frame_locator("iframe")
        frame.locator("body[data-ready='1']").wait_for(timeout=30_000)
        assert frame.get_by_label("Layer", exact=True).get_attribute("max") == "2"
    finally:
        context.close()
