"""The Q/K map view in a real browser: the measured sentence against an independent recomputation, hover
outlines the patch on the photo, a click on a query makes it the Query view's query, a click on the atlas
picks the head; and at desktop, phone (390 × 844, touch) and projector (1280 × 720) sizes, in English and
繁體中文, the sentence recomputed by hand and every chart inside the screen."""
from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import i18n
from conftest import Q, K
from serve import MEASURE, choose_view, open_page, pick, quiet, settle, shot

LABEL = "Q/K map (every query and key)"
CHART = ".st-key-result [data-testid='stVegaLiteChart']"
TOOLTIP = "#vg-tooltip-element"
EXPAND_SIDEBAR = "[data-testid='stExpandSidebarButton'], [data-testid='stSidebarCollapsedControl'] button"


def expected_numbers(real_model, layer: int, head: int) -> tuple[float, float, float]:
    """ρ(q·k, 2-D distance) and R of row / column on the page's first photo, by hand: SVD PCA of the raw q and k, ranks,
    least squares."""
    from attnviz_app.settings import DEFAULT_PHOTO

    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample(DEFAULT_PHOTO), real_model).image)
    q, k = Q(cap)[layer, head].double().numpy(), K(cap)[layer, head].double().numpy()
    points = np.concatenate([q, k])
    centred = points - points.mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    xy = u[:, :2] * s[:2]
    n = len(q)
    dist = np.linalg.norm(xy[:n, None] - xy[None, n:], axis=-1).ravel()
    logits = (q @ k.T).ravel()
    rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
    rho = np.corrcoef(rank(logits), rank(dist))[0, 1]
    tokens = np.concatenate([np.arange(n), np.arange(n)]) - 1
    patches = tokens >= 0
    design = np.column_stack([np.ones(patches.sum()), xy[patches]])
    r = []
    for target in (tokens[patches] // 14, tokens[patches] % 14):
        fitted = design @ np.linalg.lstsq(design, target, rcond=None)[0]
        r.append(np.corrcoef(fitted, target)[0, 1])
    return rho, r[0], r[1]


def cyan_box(png: bytes):
    """Bounding box (left, top, right, bottom) of the #00ffff pixels of a screenshot, or None."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    mask = (pixels[..., 0] < 40) & (pixels[..., 1] > 215) & (pixels[..., 2] > 215)
    if mask.sum() < 20:
        return None
    rows, cols = np.nonzero(mask)
    return cols.min(), rows.min(), cols.max(), rows.max()


def hover_a_point(page, chart, want_kind: str = "query"):
    """Hover the scatter's drawn points (found in a screenshot: saturated pixels left of the photo) until the
    tooltip names a patch token of kind ``want_kind``; its (row, col), 1-based."""
    pixels = np.asarray(Image.open(io.BytesIO(chart.screenshot())).convert("RGB")).astype(int)
    scale = pixels.shape[1] / chart.bounding_box()["width"]
    saturated = (pixels.max(-1) - pixels.min(-1)) > 80
    saturated[:, int(pixels.shape[1] * 0.6):] = False  # the photo is on the right
    saturated[: int(pixels.shape[0] * 0.1)] = False  # the legend of shapes is on top
    ys, xs = np.nonzero(saturated)
    order = np.random.default_rng(0).permutation(len(xs))[:400]
    for y, x in zip(ys[order], xs[order]):
        chart.hover(position={"x": x / scale, "y": y / scale})
        page.wait_for_timeout(40)
        tip = page.locator(TOOLTIP)
        if tip.count() and tip.is_visible():
            text = tip.inner_text()
            found = re.search(r"patch \(row (\d+), column (\d+)\)", text)
            if found and re.search(rf"\b{want_kind}\b", text):
                return int(found[1]), int(found[2])
    raise AssertionError("no point of the scatter showed a patch tooltip")


@pytest.mark.browser
def test_desktop_map_sentence_hover_click_and_atlas(app_in_chromium, real_model):
    url, browser = app_in_chromium
    page = open_page(browser, "desktop")
    page.goto(url)
    page.locator(".st-key-view input").wait_for(timeout=180_000)
    settle(page)
    choose_view(page, LABEL, "qkmap")
    page.locator(CHART).first.wait_for(timeout=120_000)
    pick(page, "head", "head 3", exact=True)
    pick(page, "qk_normalize", "Leave them as they are", exact=True)
    page.get_by_text("Layer 12, head 3: every query and key as a point").wait_for(timeout=60_000)
    rho, row_r, col_r = expected_numbers(real_model, 11, 2)
    text = page.locator(".st-key-result").inner_text()
    assert f"is {rho:+.2f}" in text, text
    assert f"patch row with R = {row_r:.2f} and the column with R = {col_r:.2f}" in text, text
    assert page.locator("[data-testid='stException']").count() == 0

    # Hover: the photo beside the map outlines that point's patch, one cell of the 14 × 14 grid.
    chart = page.locator(CHART).first
    chart.scroll_into_view_if_needed()
    settle(page)
    page.mouse.move(1, 1)  # off the map: a point drawn under a resting pointer counts as hovered
    page.wait_for_timeout(300)
    before = cyan_box(chart.screenshot())
    row, col = hover_a_point(page, chart)
    page.wait_for_timeout(300)
    png = chart.screenshot()
    outline = cyan_box(png)
    assert before is None and outline is not None
    side = outline[2] - outline[0]
    photo_px = 240  # PHOTO_PX: the photo's side in the chart
    assert abs(side - photo_px / 14) <= 4, outline  # one patch, not the whole grid
    shot(page, "qkmap_hover_desktop")
    # The cell's place inside the photo is the tooltip's row and column: the photo's right edge is the chart's.
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    photo_right = max(c for c in range(pixels.shape[1]) if (np.abs(pixels[:, c].astype(int) - 255).sum(-1) > 60).sum() > 150)
    left_of_photo = photo_right + 1 - photo_px
    assert abs((outline[0] - left_of_photo) / (photo_px / 14) - (col - 1)) < 0.5, (outline, col, photo_right)

    # Click that query: it becomes the session's query, so the map's pink lines start there, the address names it,
    # and the Query view shows it.
    page.mouse.down()
    page.mouse.up()
    settle(page)
    page.get_by_text(f"the query of patch (row {row}, column {col}) attends to most").wait_for(timeout=60_000)
    page.wait_for_function("q => new URL(location.href).searchParams.get('query') === q", arg=f"r{row}c{col}",
                           timeout=30_000)
    choose_view(page, "Any query token → patches", "query")
    page.get_by_text(f"patch (row {row}, column {col})").first.wait_for(timeout=60_000)

    # The atlas: a click on the tile of layer 3, head 4 chooses that layer and head.
    choose_view(page, LABEL, "qkmap")
    atlas = page.locator(CHART).nth(1)
    atlas.scroll_into_view_if_needed()
    settle(page)
    image = np.asarray(Image.open(io.BytesIO(atlas.screenshot())).convert("RGB")).astype(int)
    tiles = np.all(image == 246, -1)  # the tiles' grey background (atlas_picture)
    cols = np.nonzero(tiles.sum(0) > tiles.shape[0] * 0.3)[0]
    col_starts = [cols[0], *cols[1:][np.diff(cols) > 1]]
    assert len(col_starts) == 6, col_starts  # six heads across
    pitch = (col_starts[-1] - col_starts[0]) / 5
    rows = np.nonzero(tiles.sum(1) > 0)[0]
    gap = pitch * 4 / 76  # atlas_picture: 72 px tiles, 4 px apart
    row_pitch = (rows[-1] - rows[0] + 1 + gap) / 12  # twelve layers down (Streamlit may stretch the picture a little)
    scale = image.shape[1] / atlas.bounding_box()["width"]
    x, y = (col_starts[3] + pitch / 2) / scale, (rows[0] + 2.5 * row_pitch - gap / 2) / scale
    box = atlas.bounding_box()
    atlas.click(position={"x": float(x), "y": float(y)})
    settle(page)
    page.get_by_text("Layer 3, head 4: every query and key as a point").wait_for(timeout=60_000)
    assert box["width"] > 0
    page.close()


@pytest.mark.browser
# Every screen through the boxes in English, the longer language; the link in Chinese on the phone, as a student's
# (the words in both languages are AppTest's: tests/test_qkmap_page.py).
@pytest.mark.parametrize("where, lang", [("desktop", "en"), ("phone", "en"), ("projector", "en"), ("phone", "zh-TW")])
def test_map_at_each_size_in_both_languages(app_in_chromium, where, lang, real_model):
    """In English the map is reached as a reader would, through the View and normalisation boxes; in Chinese a link
    opens it (/?lang=zh-TW&view=qkmap&normalize=none, the presenter view on the projector), as a student's phone
    would from the join box's QR code."""
    url, browser = app_in_chromium
    page = open_page(browser, where)
    if lang == "en":
        page.goto(url + ("/?present=1" if where == "projector" else "/"))
        page.locator(".st-key-view input").wait_for(timeout=180_000)
        settle(page)
        choose_view(page, LABEL, "qkmap")
        page.locator(CHART).first.wait_for(timeout=120_000)
        pick(page, "qk_normalize", i18n.text(lang, "qkmap.normalize_none"))
    else:
        page.goto(url + "/?lang=zh-TW&view=qkmap&normalize=none" + ("&present=1" if where == "projector" else ""))
    page.get_by_text(i18n.text(lang, "qkmap.title", layer=12, head=1)).wait_for(timeout=180_000)
    assert page.locator(".st-key-qk_normalize input").input_value() == i18n.text(lang, "qkmap.normalize_none")
    rho, _, _ = expected_numbers(real_model, 11, 0)
    settle(page)  # the title is drawn before the run that draws the measured sentence below it is over
    text = page.locator(".st-key-result").inner_text()
    assert f"{rho:+.2f}" in text, text  # the measured sentence, in this language
    got = page.evaluate(MEASURE)
    assert got["page"] == got["vw"] and got["main"] <= got["vw"] and not got["clipped"], (where, got)
    for chart in page.locator(f"{CHART} canvas, {CHART} svg.marks").all():
        box = chart.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= got["vw"] + 0.5, (where, box)
    assert page.locator("[data-testid='stException']").count() == 0
    page.locator(".st-key-result h3").first.evaluate("e => e.scrollIntoView()")
    shot(page, f"qkmap_{where}_{lang}")
    page.close()


@pytest.mark.browser
def test_the_largest_input_on_a_small_laptop_is_scaled_into_its_column_and_clicks_stay_right(app_in_chromium):
    """At 518 px (1 + 37 × 37 tokens: 2740 points) the map is drawn as SVG (Streamlit's own choice above 2000
    points would be a canvas, cut off at the right in a 1024 px laptop's column); hover and click still pick the
    point under the pointer on the scaled chart."""
    url, browser = app_in_chromium
    page = open_page(browser, "desktop", viewport={"width": 1024, "height": 768})
    page.goto(url + "/?view=qkmap&head=1")
    page.locator(".st-key-view input").wait_for(timeout=180_000)
    pick(page, "size", "518 px", exact=True)
    settle(page)
    chart = page.locator(CHART).first
    page.wait_for_function(  # every query and key of the 518 px capture, as SVG symbols
        "s => document.querySelectorAll(s).length >= 2740", arg=f"{CHART} svg.marks g.mark-symbol path", timeout=120_000)
    assert chart.locator("svg.marks").count() == 1 and chart.locator("canvas").count() == 0
    got = page.evaluate(MEASURE)
    assert not got["clipped"] and got["page"] == got["vw"] == 1024, got
    drawn = chart.locator("svg.marks").bounding_box()
    assert drawn["width"] < 810 and drawn["x"] + drawn["width"] <= 1024, drawn  # scaled down from its 810 px
    chart.scroll_into_view_if_needed()
    page.mouse.move(1, 1)
    row, col = hover_a_point(page, chart)
    assert 1 <= row <= 37 and 1 <= col <= 37
    page.mouse.down()
    page.mouse.up()
    settle(page)
    choose_view(page, "Any query token → patches", "query")
    page.get_by_text(f"patch (row {row}, column {col})").first.wait_for(timeout=60_000)
    shot(page, "qkmap_518_laptop")
    page.close()


@pytest.mark.browser
def test_the_presenter_view_opens_on_the_map_not_on_the_atlas_below_it(app_in_chromium):
    """A link to the Q/K map in the presenter view opens with the map on the screen: the page brings a view's first
    big picture into view (it took the tallest one, the atlas, and scrolled the map out of sight)."""
    url, browser = app_in_chromium
    page = open_page(browser, "projector")
    page.goto(url + "/?view=qkmap&layer=12&head=3&query=r5c9&photo=coffee&lang=zh-TW&present=1")
    page.locator(f"{CHART} svg.marks").first.wait_for(timeout=180_000)
    settle(page)
    quiet(page)
    plot = page.locator(CHART).nth(0).bounding_box()
    assert -0.5 <= plot["y"] < 720 / 2, plot  # the map's top on the screen, not scrolled past
    page.close()
