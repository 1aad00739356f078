"""The WebGL scatter (attnviz_app/qk_scatter.js) in the real server and a real headless Chromium (no GPU: WebGL
on SwiftShader), on a small known map (tests/qk_scatter_page.py), in English and 繁體中文, on a desktop (mouse)
and a phone (touch): every point painted where the Python side put it and in its colour; a drag moves the
picture by as much as the pointer moved; the wheel and two fingers zoom about the pointer (the fingers'
middle), queries circles and keys squares; hovering (tapping) a point shows its photo, kind and token. A browser
without WebGL gets the Altair chart and one line that says so."""
from __future__ import annotations

import base64
import io
import sys

import numpy as np
import pytest
from PIL import Image

from attnviz import i18n
from attnviz_app import qk_scatter
from qk_scatter_page import NAMES, known_map
from serve import CHROMIUM_FLAGS, ROOT, chromium, chromium_path, open_page, require_chromium, shot, \
    streamlit_server

CANVAS = "canvas.qk-canvas"
PAGE = [sys.executable, "-m", "streamlit", "run", str(ROOT / "tests" / "qk_scatter_page.py")]
FRAMES = "() => Number(document.querySelector('canvas.qk-canvas')?.dataset.frames || 0)"
NEXT_FRAME = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
WHEEL = 300  # one wheel step's deltaY as Playwright is asked (the page gets 150 at 2 device pixels a CSS pixel)


@pytest.fixture(scope="module")
def served():
    require_chromium()
    with streamlit_server(launcher=PAGE) as (url, _), chromium() as browser:
        yield url, browser


def load(page, url: str, lang: str) -> None:
    page.goto(f"{url}/?lang={lang}")
    page.wait_for_function(f"() => ({FRAMES})() >= 1", timeout=120_000)
    page.evaluate(NEXT_FRAME)


def drawn(page) -> int:
    page.evaluate(NEXT_FRAME)
    return page.evaluate(FRAMES)


def pixels(page) -> np.ndarray:
    """The canvas read back (toDataURL): (H, W, 4) device pixels, alpha not premultiplied."""
    url = page.locator(CANVAS).evaluate("c => c.toDataURL('image/png')")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGBA")).astype(int)


def first_places(page) -> np.ndarray:
    """(P, 2) page CSS pixels: where the first view puts each point — its box and MARGIN of it on each side,
    the first direction across, the second up."""
    qk, _, _ = known_map()
    box = page.locator(CANVAS).bounding_box()
    lo, hi = qk.xy.min(0), qk.xy.max(0)
    lo, hi = lo - qk_scatter.MARGIN * (hi - lo), hi + qk_scatter.MARGIN * (hi - lo)
    return np.stack([box["x"] + (qk.xy[:, 0] - lo[0]) / (hi[0] - lo[0]) * box["width"],
                     box["y"] + (hi[1] - qk.xy[:, 1]) / (hi[1] - lo[1]) * box["height"]], 1)


def at(page, picture: np.ndarray, place) -> np.ndarray:
    """The RGBA pixel under page CSS point ``place``."""
    box = page.locator(CANVAS).bounding_box()
    scale = picture.shape[1] / box["width"]  # the device pixel ratio
    return picture[int((place[1] - box["y"]) * scale), int((place[0] - box["x"]) * scale)]


def check_points(page, places: np.ndarray, moved_from: np.ndarray | None = None) -> int:
    """Every point whose place is inside the canvas is painted there in its colour (60 % opaque); with
    ``moved_from``, nothing is left where it was. Returns how many points were checked."""
    qk, values, _ = known_map()
    colours = qk_scatter.colours(values, categorical=False)
    picture = pixels(page)
    box = page.locator(CANVAS).bounding_box()
    checked = 0
    for i, place in enumerate(places):
        inside = (box["x"] + 4 < place[0] < box["x"] + box["width"] - 4
                  and box["y"] + 4 < place[1] < box["y"] + box["height"] - 4)
        if not inside:
            continue
        pixel = at(page, picture, place)
        assert abs(pixel[3] - 153) <= 3 and np.abs(pixel[:3] - colours[i]).max() <= 6, (i, pixel, colours[i])
        if moved_from is not None:
            assert at(page, picture, moved_from[i])[3] == 0, i
        checked += 1
    return checked


def row_width(picture: np.ndarray, page, centre, dy: float, reach: float) -> int:
    """Painted device pixels on the row ``dy`` CSS px below ``centre``, within ``reach`` CSS px either side."""
    box = page.locator(CANVAS).bounding_box()
    scale = picture.shape[1] / box["width"]
    y = int((centre[1] + dy - box["y"]) * scale)
    x0, x1 = int((centre[0] - reach - box["x"]) * scale), int((centre[0] + reach - box["x"]) * scale)
    return int((picture[y, x0:x1, 3] > 0).sum())


def check_tooltip(page, lang: str, point: int) -> None:
    qk, _, _ = known_map()
    tip = page.locator(".qk-tip")
    tip.wait_for(state="visible", timeout=10_000)
    text = tip.inner_text()
    kind = i18n.text(lang, "qkmap.key" if qk.is_key[point] else "qkmap.query")
    patch = int(qk.token[point]) - 1
    label = i18n.text(lang, "analysis.patch", row=patch // 3 + 1, col=patch % 3 + 1)
    for word in (i18n.text(lang, "qkmap.colour_photo"), NAMES[qk.photo[point]], i18n.text(lang, "qkmap.kind"), kind,
                 i18n.text(lang, "qkmap.token"), label):
        assert word in text, (word, text)


def check_frame(page, lang: str, vw: int) -> None:
    """The words around the picture, and nothing wider than the screen."""
    assert i18n.text(lang, "qkmap.query") in page.locator(".qk-shapes").inner_text()
    assert i18n.text(lang, "qkmap.key") in page.locator(".qk-shapes").inner_text()
    assert page.locator(".qk-xtitle").inner_text() == i18n.text(lang, "qkmap.axis_1")
    assert page.locator(".qk-ytitle").inner_text() == i18n.text(lang, "qkmap.axis_2")
    colours = page.locator(".qk-colours").inner_text()
    for word in (i18n.text(lang, "qkmap.colour_row"), "1", "59", i18n.text(lang, "qkmap.legend_none")):
        assert word in colours, (word, colours)
    box = page.locator(CANVAS).bounding_box()
    assert abs(box["height"] - 460) <= 1 and box["x"] >= 0 and box["x"] + box["width"] <= vw, box
    assert page.evaluate("() => document.documentElement.scrollWidth") <= vw
    assert page.locator("[data-testid='stException']").count() == 0


@pytest.mark.browser
@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_desktop_paints_drags_zooms_and_shows_the_tooltip(served, lang):
    url, browser = served
    page = open_page(browser, "desktop", device_scale_factor=2)  # two device pixels a CSS pixel: shapes show
    load(page, url, lang)
    check_frame(page, lang, 1400)
    places = first_places(page)
    assert check_points(page, places) == 60

    page.mouse.move(*places[23])  # photo 2's query of token 3: patch (1, 3)
    check_tooltip(page, lang, 23)
    page.mouse.move(*places[45])  # photo 3, whose name is HTML: shown as text
    check_tooltip(page, lang, 45)

    # A drag from between the points moves every point by the pointer's path.
    frames = drawn(page)
    start = (places[0] + places[11]) / 2
    page.mouse.move(*start)
    page.mouse.down()
    for step in range(1, 5):
        page.mouse.move(start[0] + 17 * step / 4, start[1] - 11 * step / 4)
    page.mouse.up()
    assert drawn(page) > frames
    moved = places + (17, -11)
    assert check_points(page, moved, moved_from=places) >= 50

    # Two wheel steps up at point 5 (a query): it stays under the pointer, the rest spread out by exp(−0.002 · ΔY),
    # ΔY as the page received it (Playwright scales its wheel by the device pixel ratio).
    page.locator(CANVAS).evaluate("c => { window.wheeled = 0; c.addEventListener('wheel', e => wheeled += e.deltaY); }")
    page.mouse.move(*moved[5])
    for _ in range(2):
        page.mouse.wheel(0, -WHEEL)
        page.evaluate(NEXT_FRAME)
    zoom = np.exp(-0.002 * page.evaluate("() => window.wheeled"))
    assert zoom > 1.5, zoom
    zoomed = moved[5] + (moved - moved[5]) * zoom
    assert check_points(page, zoomed) >= 3
    # Point 5 is a query, a circle: narrower three quarters of the way up than through its middle; point 15,
    # the key of the same token, a square (0.85 of the circle's width): as wide. Their side now: 4.5 px × √zoom.
    half = qk_scatter_half(zoom)
    picture = pixels(page)
    for point, circle in ((5, True), (15, False)):
        middle = row_width(picture, page, zoomed[point], 0, 2 * half)
        high = row_width(picture, page, zoomed[point], -0.75 * half, 2 * half)
        device = 2 * 2 * half  # the circle's width in device pixels
        assert abs(middle - (device if circle else 0.85 * device)) <= 2, (point, middle, device)
        assert (high / middle < 0.8) if circle else (high == middle), (point, high, middle)
    shot(page, f"qk_scatter_desktop_{lang}")
    page.close()


def qk_scatter_half(zoom: float) -> float:
    """Half a point's side in CSS pixels at ``zoom`` (qk_scatter.js: 4.5 px, × √zoom up to 2.5 ×)."""
    return 4.5 * min(2.5, np.sqrt(max(1.0, zoom))) / 2


@pytest.mark.browser
@pytest.mark.parametrize("lang", ["zh-TW"])  # the tooltip's words in both languages: the desktop test above
def test_phone_paints_pans_and_pinches_by_touch_and_taps_a_tooltip(served, lang):
    url, browser = served
    page = open_page(browser, "phone")
    load(page, url, lang)
    page.locator(CANVAS).scroll_into_view_if_needed()
    page.evaluate(NEXT_FRAME)
    check_frame(page, lang, 390)
    places = first_places(page)
    assert check_points(page, places) == 60

    # A finger drags the picture (Chrome's own touch events, as a phone sends them).
    cdp = page.context.new_cdp_session(page)
    start = (places[0] + places[11]) / 2
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": start[0], "y": start[1]}]})
    for step in range(1, 5):
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [
            {"x": start[0] + 13 * step / 4, "y": start[1] - 9 * step / 4}]})
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
    page.evaluate(NEXT_FRAME)
    moved = places + (13, -9)
    assert check_points(page, moved, moved_from=places) >= 50

    page.touchscreen.tap(*moved[23])
    check_tooltip(page, lang, 23)

    # Two fingers spread from 40 to 80 px apart about point 23: it stays between them, the rest spread out 2 ×.
    middle = moved[23]

    def fingers(gap: float) -> list[dict]:
        return [{"x": middle[0] - gap / 2, "y": middle[1], "id": 1},
                {"x": middle[0] + gap / 2, "y": middle[1], "id": 2}]

    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": fingers(40)})
    for gap in (50, 60, 70, 80):
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": fingers(gap)})
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
    page.evaluate(NEXT_FRAME)
    assert check_points(page, middle + (moved - middle) * 2) >= 12
    shot(page, f"qk_scatter_phone_{lang}")
    page.close()


@pytest.mark.browser
def test_without_webgl_the_altair_chart_and_one_line(served):
    url, running = served
    browser = running.browser_type.launch(executable_path=chromium_path(), args=[*CHROMIUM_FLAGS, "--disable-webgl"])
    try:
        page = open_page(browser, "desktop")
        page.goto(f"{url}/?lang=en")
        page.locator("[data-testid='stVegaLiteChart'] canvas").wait_for(timeout=120_000)
        page.locator("[data-testid='stCaptionContainer']", has_text=i18n.text("en", "qkmap.no_webgl")).wait_for(
            timeout=30_000)
        assert page.locator(CANVAS).count() == 0
        assert page.locator("[data-testid='stException']").count() == 0
    finally:
        browser.close()
