"""The page on a phone (390 × 844, touch) and on a projector (1280 × 720, ?present=1), in a real browser.

One server and one Chromium for the whole file. For every view and lesson tab: nothing overflows
sideways (the page's scroll width equals the viewport's) and the heatmap's box lies inside the screen.
Phone photos (a rotated 12-megapixel JPEG, an iPhone HEIC) go through the real upload widget.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from serve import chromium, require_chromium, streamlit_server

from make_corpus import entries

PHONE_UA = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
            "Version/17.5 Mobile/15E148 Safari/604.1")
SHOTS = Path(os.environ.get("ATTNVIZ_SHOTS", "")) if os.environ.get("ATTNVIZ_SHOTS") else None
VIEWS = {  # view key → its label in English, as the View box shows it
    "cls": "Class token → patches", "query": "Any query token → patches", "matrix": "Full N × N attention matrix",
    "heads": "All layers and heads at a glance", "rollout": "Attention rollout", "mask": "Mass mask (DINO)",
    "stats": "Head statistics: local → global", "relevance": "Class-specific map",
}
# The largest picture or chart of the view's result, and the page's widths.
MEASURE = """() => {
  const box = document.querySelector('.st-key-result');
  const all = box ? [...box.querySelectorAll('img, canvas, svg.marks')].filter(
    p => p.closest('[data-stale="true"]') === null) : [];  // not what the previous run left
  const big = all.map(p => p.getBoundingClientRect()).filter(r => r.height > 120).sort((a, b) => b.height - a.height);
  const main = document.querySelector('[data-testid="stMain"]');
  return {vw: window.innerWidth, vh: window.innerHeight, page: document.documentElement.scrollWidth,
          main: main ? main.scrollWidth : 0, heat: big.length ? {top: big[0].top, bottom: big[0].bottom,
          left: big[0].left, right: big[0].right, height: big[0].height} : null};
}"""
HEATMAP = ".st-key-result [data-testid='stImage'] img"
PHOTOS = {e.name: e.data for e in entries() if e.name in ("phone_12mp_rotated.jpg", "iphone_12mp_rotated.heic")}


@pytest.fixture(scope="module")
def server():
    require_chromium()
    with streamlit_server() as (url, _proc), chromium() as browser:
        yield url, browser


def shot(page, name: str) -> None:
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SHOTS / f"{name}.png")


def settle(page) -> None:
    """Wait until the page's run is over and its pictures are drawn."""
    page.wait_for_timeout(300)
    page.wait_for_selector("[data-testid='stStatusWidget']", state="detached", timeout=120_000)
    page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=60_000)
    page.wait_for_timeout(700)  # the scroll to a new heatmap polls every 100 ms


SHOWN = {  # what each view's result shows once it is drawn
    "query": ".st-key-result [data-stale='false'] [data-testid='stVegaLiteChart']",
    "heads": ".st-key-result [data-stale='false'] [data-testid='stVegaLiteChart']",
    "stats": ".st-key-result [data-testid='stVegaLiteChart']",
    "relevance": ".st-key-result [data-testid='stAlertContentInfo']",
}
BIG_PICTURE = """() => [...document.querySelectorAll('.st-key-result img, .st-key-result canvas, .st-key-result svg.marks')]
  .some(p => p.getBoundingClientRect().height > 120 && p.complete !== false && !p.closest('[data-stale="true"]'))"""


def choose_view(page, key: str, label: str) -> None:
    box = page.locator(".st-key-view input")
    option = page.get_by_role("option").filter(has_text=label).first
    for _ in range(3):  # a tap during a re-run can be lost: open the list again
        box.click()
        try:
            option.wait_for(timeout=5_000)
            break
        except Exception:
            page.keyboard.press("Escape")
    option.click()
    page.locator(".st-key-view input").and_(page.locator(f"[value^='{label[:12]}']")).wait_for(timeout=30_000)
    if key in SHOWN:
        page.locator(SHOWN[key]).first.wait_for(timeout=120_000)
    if key not in ("stats", "relevance"):
        page.wait_for_function(BIG_PICTURE, timeout=120_000)
    settle(page)


def assert_fits(page, where: str, whole_heatmap: bool = True) -> dict:
    if whole_heatmap:  # a chart is drawn again once its data arrives, and the page scrolls after the run
        page.wait_for_function(BIG_PICTURE, timeout=30_000)
        try:
            page.wait_for_function(f"() => {{ const g = ({MEASURE})(); return g.heat && g.heat.top >= 0 && "
                                   "g.heat.bottom <= g.vh + 0.5; }", timeout=10_000)
        except Exception:
            pass  # the assertions below say what is wrong
    got = page.evaluate(MEASURE)
    assert got["page"] == got["vw"] and got["main"] <= got["vw"], (where, got)  # nothing wider than the screen
    heat = got["heat"]
    if whole_heatmap:
        assert heat is not None, (where, got)
        assert heat["left"] >= 0 and heat["right"] <= got["vw"] + 0.5, (where, heat)
        assert heat["top"] >= -0.5 and heat["bottom"] <= got["vh"] + 0.5, (where, heat)
    return got


@pytest.mark.browser
def test_phone_upload_views_and_lesson(server):
    url, browser = server
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                                  user_agent=PHONE_UA, device_scale_factor=2)
    page = context.new_page()
    page.goto(url)
    page.get_by_text("Upload a photo", exact=True).click(timeout=120_000)
    upload = page.locator("input[type=file]")
    upload.set_input_files(files=[{"name": "IMG_0001.HEIC", "mimeType": "image/heic",
                                   "buffer": PHOTOS["iphone_12mp_rotated.heic"]}])
    page.locator(HEATMAP).first.wait_for(timeout=120_000)
    settle(page)
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    assert page.get_by_text("turned upright").count() == 1
    old = page.locator(HEATMAP).first.get_attribute("src")
    upload.set_input_files(files=[{"name": "IMG_0002.jpg", "mimeType": "image/jpeg",
                                   "buffer": PHOTOS["phone_12mp_rotated.jpg"]}])
    page.wait_for_function("([s, old]) => { const i = document.querySelector(s); return i && i.src !== old && i.complete; }",
                           arg=[HEATMAP, old], timeout=120_000)
    settle(page)
    assert_fits(page, "phone, after the upload")  # the page brought the heatmap onto the first screen
    shot(page, "phone_cls_en")

    # Head choices read "head 3"; touch targets at least 40 px high
    page.locator(".st-key-head input").click()
    assert page.get_by_role("option", name="head 3", exact=True).count() == 1
    page.keyboard.press("Escape")
    for target in (".st-key-head [role='group']", ".st-key-view [role='group']", ".st-key-source label"):
        assert page.locator(target).first.bounding_box()["height"] >= 40, target

    for key, label in VIEWS.items():
        if key == "cls":
            continue
        choose_view(page, key, label)
        assert page.locator("[data-testid='stException']").count() == 0, key
        assert_fits(page, f"phone, {key}", whole_heatmap=key not in ("stats", "relevance"))
        shot(page, f"phone_{key}_en")

    # The lesson from the sidebar: the sidebar closes after the link is tapped; no tab overflows
    page.locator("[data-testid='stExpandSidebarButton'], [data-testid='stSidebarCollapsedControl'] button").first.click()
    page.get_by_role("link", name="Lesson: how attention works").click()
    page.get_by_text("Sample photo", exact=True).click(timeout=60_000)  # an upload stays on its own page
    page.get_by_role("tab").first.wait_for(timeout=60_000)
    settle(page)
    page.locator("[data-testid='stExpandSidebarButton']").wait_for(timeout=10_000)  # the sidebar closed
    assert page.locator("[data-testid='stSidebarCollapseButton']").count() == 0
    for i, tab in enumerate(page.get_by_role("tab").all()):
        tab.click()
        settle(page)
        got = page.evaluate(MEASURE)
        assert got["page"] == got["vw"] and got["main"] <= got["vw"], (f"lesson tab {i + 1}", got)
        boxes = page.locator("[role='tabpanel']:not([hidden]) img").evaluate_all(
            "imgs => imgs.map(i => i.getBoundingClientRect()).map(r => [r.left, r.right])")
        assert all(left >= 0 and right <= got["vw"] + 0.5 for left, right in boxes), (i, boxes)
        shot(page, f"phone_lesson{i + 1}_en")
    context.close()


@pytest.mark.browser
def test_presenter_view_fits_a_projector(server):
    url, browser = server
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    page.goto(url + "/?present=1")
    page.locator(HEATMAP).first.wait_for(timeout=120_000)
    settle(page)
    got = assert_fits(page, "presenter, class token")
    assert got["heat"]["height"] >= 0.6 * 720
    assert page.locator("[data-testid='stSidebar']").is_hidden() and page.locator("h1").count() == 0
    for box in (".st-key-layer", ".st-key-head"):  # Layer and Head on the same screen
        b = page.locator(box).bounding_box()
        assert b["y"] >= 0 and b["y"] + b["height"] <= 720, box
    sizes = page.evaluate("""() => [...document.querySelectorAll(
        '[data-testid="stWidgetLabel"] p, .st-key-result [data-testid="stCaptionContainer"] p')]
        .filter(e => e.getBoundingClientRect().height > 0).map(e => parseFloat(getComputedStyle(e).fontSize))""")
    assert sizes and min(sizes) >= 20, sizes  # labels and the scale's numbers
    assert page.locator(".st-key-join img").count() == 1 and "http://" in page.locator(".st-key-join").inner_text()
    shot(page, "present_cls_en")

    # Keyboard: ← steps to the previous layer, ↓ to the next head (Streamlit's button shortcuts)
    page.locator("h3").filter(has_text="Layer 12, mean of all heads").wait_for()
    page.locator("body").press("ArrowLeft")
    page.locator("h3").filter(has_text="Layer 11, mean of all heads").wait_for(timeout=30_000)
    page.locator("body").press("ArrowDown")
    page.locator("h3").filter(has_text="Layer 11, max over heads").wait_for(timeout=30_000)

    for key, label in VIEWS.items():
        if key == "cls":
            continue
        choose_view(page, key, label)
        assert page.locator("[data-testid='stException']").count() == 0, key
        assert_fits(page, f"presenter, {key}", whole_heatmap=key not in ("stats", "relevance"))
        shot(page, f"present_{key}_en")
    context.close()
