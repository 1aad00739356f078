"""The page on a phone (390 × 844, touch) and on a projector (1280 × 720, ?present=1), in a real browser.

One server and one Chromium for the whole file. For every view and lesson tab: nothing overflows
sideways (the page's scroll width equals the viewport's) and the heatmap's box lies inside the screen.
Phone photos (a rotated 12-megapixel JPEG, an iPhone HEIC) go through the real upload widget.
"""
from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest

from make_corpus import entries
from serve import BIG_PICTURE, MEASURE, NO_PICTURE, choose_option, choose_view, open_page, quiet, settle, shot

VIEWS = {  # view key → its label in English, as the View box shows it
    "cls": "Class token → patches", "query": "Any query token → patches", "matrix": "Full N × N attention matrix",
    "heads": "All layers and heads at a glance", "rollout": "Attention rollout", "mask": "Mass mask (DINO)",
    "stats": "Head statistics: local → global", "relevance": "Class-specific map",
}
HEATMAP = ".st-key-result [data-testid='stImage'] img"
PHOTOS = {e.name: e.data for e in entries() if e.name in ("phone_12mp_rotated.jpg", "iphone_12mp_rotated.heic")}


# WCAG's contrast ratio of each selector's first element's text against the page's background (and that background's
# relative luminance, as "background")
CONTRAST = """(selectors) => {
  const rgb = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = (c) => { const [r, g, b] = rgb(c).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const ground = lum(getComputedStyle(document.querySelector('[data-testid="stMain"]')).backgroundColor);
  const out = {background: ground};
  for (const s of selectors) {
    const l = lum(getComputedStyle(document.querySelector(s)).color);
    out[s] = (Math.max(l, ground) + 0.05) / (Math.min(l, ground) + 0.05);
  }
  return out;
}"""


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
    assert not got["clipped"], (where, got["clipped"])  # (box, drawing) widths of charts cut off at the right
    heat = got["heat"]
    if whole_heatmap:
        assert heat is not None, (where, got)
        assert heat["left"] >= 0 and heat["right"] <= got["vw"] + 0.5, (where, heat)
        assert heat["top"] >= -0.5 and heat["bottom"] <= got["vh"] + 0.5, (where, heat)
    return got


TOOLBAR_SHOWN = """() => [...document.querySelectorAll('[data-testid="stElementToolbar"]')]
  .filter(bar => bar.closest('[data-testid="stElementContainer"]').querySelector('[data-testid="stVegaLiteChart"]'))
  .some(bar => getComputedStyle(bar).display !== 'none' && getComputedStyle(bar).opacity !== '0')"""


def every_view_fits(page, where: str, shots: str) -> None:
    """Choose each view but the class token's in turn: no error, and it fits the screen (``assert_fits``)."""
    for key, label in VIEWS.items():
        if key == "cls":
            continue
        choose_view(page, label, key)
        assert page.locator("[data-testid='stException']").count() == 0, key
        assert_fits(page, f"{where}, {key}", whole_heatmap=key not in NO_PICTURE)
        if key == "rollout" and where == "phone":  # one column: the rollout, which the title names, comes first
            first = page.locator(".st-key-result [data-testid='stImageCaption']").first.inner_text()
            assert first.startswith("Where the information in the class token comes from"), first
        shot(page, f"{shots}_{key}_en")


@pytest.mark.browser
def test_phone_upload_views_and_lesson(app_in_chromium):
    url, browser = app_in_chromium
    page = open_page(browser, "phone")
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

    every_view_fits(page, "phone", "phone")

    # The lesson from the sidebar: the sidebar closes after the link is tapped; no tab overflows
    page.locator("[data-testid='stExpandSidebarButton'], [data-testid='stSidebarCollapsedControl'] button").first.click()
    page.get_by_role("link", name="Lesson: how attention works").click()
    # the explore page has a "Sample photo" too, and stays drawn until the lesson's run replaces it: a tap that lands
    # there leaves the lesson on the upload, with no tabs (seen once on a loaded host: no tab in 60 s)
    page.wait_for_url("**/lesson**", timeout=60_000)
    settle(page)
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
        # no chart or data frame cut off at the right: six of Q's numbers and the table of sizes scrolled out of sight
        assert not got["clipped"], (f"lesson tab {i + 1}", got["clipped"])
        boxes = page.locator("[role='tabpanel']:not([hidden]) img").evaluate_all(
            "imgs => imgs.map(i => i.getBoundingClientRect()).map(r => [r.left, r.right, r.height])")
        assert all(left >= 0 and right <= got["vw"] + 0.5 for left, right, _ in boxes), (i, boxes)
        assert all(height <= got["vh"] for _, _, height in boxes), (i, boxes)  # the tall Q matrix was 1100 px
        # every formula whole in the column: a long one used to scroll sideways, its right part out of sight
        # (KaTeX's own display is 2 px wider than its content)
        wide = page.locator("[role='tabpanel']:not([hidden]) .katex-display").evaluate_all(
            "ks => ks.filter(k => k.scrollWidth > k.clientWidth + 4).map(k => [k.scrollWidth, k.clientWidth])")
        assert not wide, (f"lesson tab {i + 1}", wide)
        cut = page.locator("[role='tabpanel']:not([hidden]) table").evaluate_all(  # the worked example's weights were
            "ts => ts.map(t => t.getBoundingClientRect().right).filter(r => r > window.innerWidth + 1)")  # out of sight
        assert not cut, (f"lesson tab {i + 1}", cut)
        shot(page, f"phone_lesson{i + 1}_en")
    page.close()

    # A link straight to the query view; a tap on the picture picks that patch, and no chart toolbar (which stays
    # after a tap on a touch screen) covers the title above it.
    page = open_page(browser, "phone")
    page.goto(url + "/?view=query")
    chart = page.locator(".st-key-result [data-testid='stVegaLiteChart']").first
    chart.locator("svg.marks").wait_for(timeout=120_000)
    settle(page)
    quiet(page)
    chart.scroll_into_view_if_needed()  # a first visit opens at the top: the student scrolls down to the picture
    box = chart.bounding_box()
    page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.get_by_text("where does patch (row 8, column 8) look?").wait_for(timeout=60_000)
    settle(page)
    quiet(page)
    assert not page.evaluate(TOOLBAR_SHOWN)
    page.close()


FIRST_SCREEN = """() => {
  const box = (e) => e && e.getBoundingClientRect();
  const [title, intro, photo, heat] = [document.querySelector("h1"), document.querySelector(".st-key-intro [data-testid='stCaptionContainer']"),
    document.querySelector(".st-key-source"), document.querySelector("%s")].map(box);
  return {title, intro, photo, heat, vh: innerHeight};
}""" % HEATMAP


@pytest.mark.browser
@pytest.mark.parametrize("screen", ["projector", "phone"])
def test_a_first_visit_opens_at_the_top_with_the_way_in(app_in_chromium, screen):
    """A first visit is not scrolled: title, intro and the Photo choice on the first screen; at 1280 × 720 the
    heatmap too (its upper half at least). A phone scrolls to the picture only after the visitor's own choice."""
    url, browser = app_in_chromium
    page = open_page(browser, screen)
    page.goto(url + "/?lang=zh-TW")
    page.locator(HEATMAP).first.wait_for(timeout=120_000)
    settle(page)
    page.wait_for_timeout(500)  # a scroll would have begun (AFTER_RUN_JS tries every 100 ms)
    got = page.evaluate(FIRST_SCREEN)
    for name in ("title", "intro", "photo"):
        assert 0 <= got[name]["top"] and got[name]["bottom"] <= got["vh"], (name, got)
    if screen == "projector":
        heat = got["heat"]
        assert heat["top"] + heat["height"] / 2 <= got["vh"], got  # at least its upper half on the first screen
    shot(page, f"first_screen_{screen}_zh")
    if screen == "phone":  # another sample photo: the visitor's own action brings its heatmap up
        old = page.locator(HEATMAP).first.get_attribute("src")
        choose_option(page, ".st-key-sample input", page.get_by_role("option", name="火箭發射"))
        page.wait_for_function("([s, old]) => { const i = document.querySelector(s); return i && i.src !== old && i.complete; }",
                               arg=[HEATMAP, old], timeout=120_000)
        settle(page)
        page.wait_for_function(f"() => {{ const h = document.querySelector(\"{HEATMAP}\").getBoundingClientRect(); "
                               "return h.top >= 0 && h.bottom <= innerHeight + 0.5; }", timeout=10_000)
    page.close()


def drawn_photo() -> bytes:
    """A photo no sample is: a red disc on a blue and yellow ground, 320 × 240 JPEG."""
    import io

    from PIL import Image, ImageDraw

    picture = Image.new("RGB", (320, 240), (30, 60, 200))
    draw = ImageDraw.Draw(picture)
    draw.rectangle((0, 160, 320, 240), fill=(240, 210, 40))
    draw.ellipse((110, 50, 210, 150), fill=(220, 30, 30))
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=92)
    return buffer.getvalue()


@pytest.mark.browser
def test_the_presenters_uploaded_photo_reaches_a_phone_through_the_address(app_in_chromium):
    """The presenter uploads a photo: the address (and so the QR code) names it by an unguessable name, and a phone
    opening that address, less ``present``, shows the same photo's heatmap at the same layer and head."""
    url, browser = app_in_chromium
    page = open_page(browser, "projector")
    page.goto(url + "/?present=1&view=cls&layer=9&head=2&lang=zh-TW")
    page.locator(HEATMAP).first.wait_for(timeout=180_000)
    settle(page)
    cat = page.locator(HEATMAP).first.get_attribute("src")
    page.get_by_text("照片", exact=True).first.click()  # the presenter's folded Photo box
    page.get_by_text("上傳照片", exact=True).click()
    page.locator("input[type=file]").set_input_files(
        files=[{"name": "class.jpg", "mimeType": "image/jpeg", "buffer": drawn_photo()}])
    page.wait_for_function("([s, old]) => { const i = document.querySelector(s); return i && i.src !== old && i.complete; }",
                           arg=[HEATMAP, cat], timeout=120_000)
    settle(page)
    page.wait_for_url("**photo=**", timeout=30_000)
    asked = dict(parse_qsl(urlsplit(page.url).query))
    assert len(asked["photo"]) == 22 and asked["present"] == "1", asked
    shown = urlsplit(page.locator(HEATMAP).first.get_attribute("src")).path
    shot(page, "present_shared_photo_zh")
    page.close()

    phone = open_page(browser, "phone")
    del asked["present"]  # what the QR code opens
    phone.goto(url + "/?" + "&".join(f"{k}={v}" for k, v in asked.items()))
    phone.locator(HEATMAP).first.wait_for(timeout=180_000)
    settle(phone)
    assert phone.get_by_role("radio", name="分享的照片").is_checked()
    assert urlsplit(phone.locator(HEATMAP).first.get_attribute("src")).path == shown  # the same picture, byte for byte
    assert shown != urlsplit(cat).path
    phone.close()


@pytest.mark.browser
def test_presenter_view_fits_a_projector(app_in_chromium):
    url, browser = app_in_chromium
    page = open_page(browser, "projector")
    page.goto(url + "/?present=1")
    page.locator(HEATMAP).first.wait_for(timeout=120_000)
    settle(page)
    got = assert_fits(page, "presenter, class token")
    assert got["heat"]["height"] >= 0.6 * 720
    assert page.locator("[data-testid='stSidebar']").is_hidden() and page.locator("h1").count() == 0
    for box in (".st-key-layer", ".st-key-head", ".st-key-join"):  # Layer, Head and the QR code on the same screen
        b = page.locator(box).bounding_box()
        assert b["y"] >= 0 and b["y"] + b["height"] <= 720, box
    sizes = page.evaluate("""() => [...document.querySelectorAll(
        '[data-testid="stWidgetLabel"] p, .st-key-result [data-testid="stCaptionContainer"] p')]
        .filter(e => e.getBoundingClientRect().height > 0).map(e => parseFloat(getComputedStyle(e).fontSize))""")
    assert sizes and min(sizes) >= 20, sizes  # labels and the scale's numbers
    assert page.locator(".st-key-join img").count() == 1 and "http://" in page.locator(".st-key-join").inner_text()
    assert page.locator(".st-key-join img").bounding_box()["width"] >= 200  # ~9 mm a module on a 2.5 m projection
    # a dark room: light type on a dark page, captions (the scale's numbers) at 7:1 or more (WCAG AAA)
    contrast = page.evaluate(CONTRAST, [".st-key-result [data-testid='stCaptionContainer'] p",
                                        "[data-testid='stWidgetLabel'] p", ".st-key-result h3", ".st-key-join p"])
    assert contrast.pop("background") < 0.02 and all(ratio >= 7 for ratio in contrast.values()), contrast
    shot(page, "present_cls_en")

    # Keyboard: ← steps to the previous layer, ↓ to the next head (Streamlit's button shortcuts)
    page.locator("h3").filter(has_text="Layer 12, mean of all heads").wait_for()
    page.locator("body").press("ArrowLeft")
    page.locator("h3").filter(has_text="Layer 11, mean of all heads").wait_for(timeout=30_000)
    page.locator("body").press("ArrowDown")
    page.locator("h3").filter(has_text="Layer 11, max over heads").wait_for(timeout=30_000)

    every_view_fits(page, "presenter", "present")
    page.close()


@pytest.mark.browser
def test_a_small_laptop_scales_pictures_into_their_columns_and_clicks_stay_right(app_in_chromium):
    """At 1024 × 768 (sidebar open) the heads grid, the neuron view's two pictures, the Q/K map and the query
    view's 512 px picture are wider than their columns: each is scaled down whole, not cut off, and a click on
    the scaled picture picks the patch under the pointer."""
    url, browser = app_in_chromium
    for view in ("heads", "neuron", "qkmap", "query"):
        page = open_page(browser, "desktop", viewport={"width": 1024, "height": 768})
        page.goto(url + f"/?view={view}")  # a link to the view (attnviz_app/links.py)
        page.locator(".st-key-result [data-testid='stVegaLiteChart'] svg.marks").first.wait_for(timeout=180_000)
        settle(page)
        got = page.evaluate(MEASURE)
        assert not got["clipped"] and got["page"] == got["vw"] == 1024, (view, got)
        if view != "query":
            page.close()
    picture = page.locator(".st-key-result [data-testid='stVegaLiteChart'] svg.marks").first
    box = picture.bounding_box()
    assert box["width"] < 400 and abs(box["width"] - box["height"]) < 1, box  # scaled from 512 px, still square
    picture.click(position={"x": box["width"] * 10.5 / 14, "y": box["height"] * 2.5 / 14})
    page.get_by_text("where does patch (row 3, column 11) look?").wait_for(timeout=60_000)
    shot(page, "laptop_1024_query_en")
    page.close()


@pytest.mark.browser
def test_presenter_view_grows_with_a_full_hd_projector(app_in_chromium):
    """On a 1920 × 1080 projector the heatmap and the QR code grow with the screen (500 px and 120 px at 720)."""
    url, browser = app_in_chromium
    page = open_page(browser, "projector", viewport={"width": 1920, "height": 1080})
    page.goto(url + "/?present=1")
    page.locator(HEATMAP).first.wait_for(timeout=120_000)
    settle(page)
    got = assert_fits(page, "presenter, 1920 × 1080")
    assert got["heat"]["height"] >= 0.75 * 1080, got["heat"]
    qr = page.locator(".st-key-join img").bounding_box()
    assert qr["width"] >= 200 and qr["y"] + qr["height"] <= 1080, qr
    shot(page, "present_1080_cls_en")
    page.close()


@pytest.mark.browser
def test_the_lesson_has_a_presenter_view_and_its_link_opens_it_on_a_phone(app_in_chromium):
    """``/lesson?present=1``: no sidebar or title, type at 20 px or more, Layer, Head, the join box and the first
    step's tabs on one 1280 × 720 screen; the address follows the step shown, and (the QR code's link, less
    ``present``) opens the same step, photo and language on a phone, scrolled to the steps."""
    url, browser = app_in_chromium
    page = open_page(browser, "projector")
    page.goto(url + "/lesson?present=1&photo=rocket&lang=zh-TW")
    page.locator(".st-key-join img").wait_for(timeout=180_000)
    settle(page)
    assert page.locator("[data-testid='stSidebar']").is_hidden() and page.locator("h1").count() == 0
    tab = page.get_by_role("tab").first
    for where in (page.locator(".st-key-lesson_layer"), page.locator(".st-key-join"), tab):
        b = where.bounding_box()
        assert b["y"] >= 0 and b["y"] + b["height"] <= 720, b
    sizes = page.evaluate("""() => [...document.querySelectorAll('[data-testid="stWidgetLabel"] p, [data-testid="stMarkdownContainer"] li')]
        .filter(e => e.getBoundingClientRect().height > 0).map(e => parseFloat(getComputedStyle(e).fontSize))""")
    assert sizes and min(sizes) >= 20, sizes
    assert "/lesson" in page.locator(".st-key-join code").inner_text()
    shot(page, "present_lesson_zh")
    page.locator("body").press("ArrowRight")  # a remote clicker's →: step 2
    page.wait_for_url("**step=2**", timeout=60_000)
    settle(page)
    assert page.get_by_role("tab", selected=True).inner_text().startswith("2")
    page.get_by_role("tab").nth(3).click()  # step 4: the address, so the QR code, follows the step shown
    page.wait_for_url("**step=4**", timeout=60_000)
    settle(page)
    page.wait_for_timeout(1000)
    assert page.get_by_role("tab", selected=True).inner_text().startswith("4")  # and the page stays on it
    address = urlsplit(page.url)
    assert address.path == "/lesson" and dict(parse_qsl(address.query)) == {
        "present": "1", "layer": "12", "head": "1", "step": "4", "photo": "rocket", "lang": "zh-TW"}
    page.close()

    phone = open_page(browser, "phone")
    phone.goto(url + "/lesson?layer=12&head=1&step=4&photo=rocket&lang=zh-TW")  # what the QR code opens
    phone.get_by_text("課程：注意力如何運作").first.wait_for(timeout=180_000)
    settle(phone)
    assert phone.locator(".st-key-sample input").input_value() == "火箭發射"
    tab = phone.get_by_role("tab", selected=True)
    assert tab.inner_text().startswith("4")
    # the page opens scrolled to the steps, not on the title two screens above them (and stays there while the
    # pictures above are laid out: a few seconds at most)
    phone.wait_for_function("""() => {
        const b = document.querySelector('[role="tab"][aria-selected="true"]').getBoundingClientRect();
        return b.top >= 0 && b.bottom <= 844 / 3 && b.left >= 0 && b.right <= 390; }""", timeout=5_000)
    assert phone.locator("[data-testid='stSidebar']").is_hidden() or phone.locator("h1").count() == 1
    shot(phone, "lesson_link_phone_zh")
    phone.close()


# The shown step's tab strip, its first picture over 100 px tall (img, canvas or SVG chart) and its first displayed
# formula: their boxes, and the formulas' type sizes.
STEP_ON_SCREEN = """() => {
  const panel = document.querySelector('[role="tabpanel"]:not([hidden])');
  const box = (e) => { if (!e) return null; const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; };
  const picture = [...panel.querySelectorAll('img, canvas, svg.marks')].find(p => p.getBoundingClientRect().height > 100);
  return {tabs: box(document.querySelector('[role="tablist"]')), picture: box(picture),
          formula: box(panel.querySelector('.katex-display')),
          sizes: [...panel.querySelectorAll('.katex-display > .katex')].map(k => parseFloat(getComputedStyle(k).fontSize))};
}"""


@pytest.mark.browser
@pytest.mark.parametrize("lang, steps", [("en", range(7)), ("zh-TW", (0, 3, 5))])
def test_each_lesson_step_fits_a_projector_with_its_picture_and_formula(app_in_chromium, lang, steps):
    """``/lesson?present=1`` at 1280 × 720: for every step, the tabs, the step's picture and its key formula on the
    first screen, nothing scrolled (each was about two screens down, under the page's controls), and the formulas in
    type of 20 px or more (they were 19 px)."""
    url, browser = app_in_chromium
    page = open_page(browser, "projector")
    page.goto(url + f"/lesson?present=1&lang={lang}")
    page.get_by_role("tab").first.wait_for(timeout=180_000)
    settle(page)
    for step in steps:
        page.get_by_role("tab").nth(step).click()
        page.wait_for_url(f"**step={step + 1}**", timeout=60_000)
        settle(page)
        try:  # the step's picture is laid out after its run ends (its height is 0 until the image has decoded)
            page.wait_for_function(f"() => {{ const g = ({STEP_ON_SCREEN})(); return g.picture && g.formula; }}",
                                   timeout=30_000)
        except Exception:
            pass  # the assertions below say what is missing
        got = page.evaluate(STEP_ON_SCREEN)
        for part in ("tabs", "picture", "formula"):
            assert got[part] is not None, (lang, step + 1, part, got)
            assert got[part]["top"] >= 0 and got[part]["bottom"] <= 720, (lang, step + 1, part, got)
        assert min(got["sizes"]) >= 20, (lang, step + 1, got["sizes"])
        shot(page, f"present_lesson_step{step + 1}_{lang}")
    page.close()


BUTTON_NAMES = "() => [...document.querySelectorAll('button[aria-label]')].map(b => b.ariaLabel)"


def button_names(page, awaited: str) -> list[str]:
    """The names a screen reader says for the page's buttons, once ``awaited`` is among them (up to 30 s): the help
    buttons are drawn, and their names rewritten, after the run's end, on a busy host later (15 s once was not enough
    beside another worker's real-model tests)."""
    try:
        page.wait_for_function(f"awaited => ({BUTTON_NAMES})().includes(awaited)", arg=awaited, timeout=30_000)
    except Exception:
        pass  # the caller's assertion shows every name there is
    return page.evaluate(BUTTON_NAMES)


@pytest.mark.browser
def test_streamlits_own_words_in_the_uploader_and_camera_follow_the_language(app_in_chromium):
    """Streamlit writes "Upload", "50MB per file", "Take Photo", its toolbars' tooltips and its buttons' names for
    screen readers ("Help for …") in English only: on a Chinese page they are Chinese (attnviz_app/text.py,
    widget_words), and back in English they are Streamlit's words again; the elements that only run a script leave
    no gap above the title."""
    from serve import CHROMIUM_FLAGS, FAKE_CAMERA_FLAGS, chromium_path, choose_option

    url, running = app_in_chromium
    browser = running.browser_type.launch(executable_path=chromium_path(), args=[*CHROMIUM_FLAGS, *FAKE_CAMERA_FLAGS])
    try:
        page = open_page(browser, "desktop")
        page.goto(url + "/?lang=zh-TW")
        page.locator(".st-key-source").wait_for(timeout=180_000)
        settle(page)
        gap = """() => document.querySelector('h1').getBoundingClientRect().top -
            document.querySelector('[data-testid=stMainBlockContainer]').getBoundingClientRect().top"""
        try:  # 96 px once laid out (each script's element added 16 more); on a loaded host the layout can lag the run
            page.wait_for_function(f"() => ({gap})() < 100", timeout=15_000)
        except Exception:
            pytest.fail(f"the title is {page.evaluate(gap)} px below the top of the page, not 96")
        assert page.locator("[data-testid=stSkipToContent]").inner_text() == "跳到主要內容"  # the keyboard's first stop
        # the names a screen reader says for Streamlit's buttons, and a chart toolbar's tooltips
        names = button_names(page, "「平滑熱力圖」的說明")
        assert "「平滑熱力圖」的說明" in names and any(n.startswith("全螢幕：") for n in names), " | ".join(names)
        assert not [n for n in names if n.startswith(("Help for", "Fullscreen", "Collapse"))], names
        chart = open_page(browser, "desktop")
        chart.goto(url + "/?lang=zh-TW&view=query")
        chart.locator("[data-testid=stVegaLiteChart]").first.wait_for(timeout=180_000)
        settle(chart)
        buttons = chart.locator("[data-testid=stElementToolbar] button")
        for _ in range(60):  # the toolbar shows while the pointer is over the chart (which a late rerun may move)
            chart.locator("[data-testid=stVegaLiteChart]").first.hover()
            if buttons.count():
                break
            chart.wait_for_timeout(1000)
        show_data = chart.locator("[data-testid=stElementToolbar] button[aria-label^='顯示資料']").first
        show_data.hover(timeout=30_000)
        assert show_data.get_attribute("aria-label").startswith("顯示資料：第 12 層")  # the button and the chart it serves
        chart.get_by_role("tooltip").filter(has_text="顯示資料").wait_for(timeout=30_000)
        # a number box's − and + (the lesson's worked example) and a code block's copy button (the dataset page)
        for path, english, chinese in (("/lesson?lang=zh-TW&step=2", ("Decrement", "Increment"), ("減少", "增加")),
                                       ("/dataset?lang=zh-TW", ("Copy to clipboard",), ("複製到剪貼簿",))):
            chart.goto(url + path)
            chart.wait_for_function("w => [...document.querySelectorAll('button[aria-label]')].some(b => b.ariaLabel === w)",
                                    arg=chinese[0], timeout=180_000)
            named = chart.evaluate("() => [...document.querySelectorAll('button[aria-label]')].map(b => b.ariaLabel)")
            assert set(chinese) <= set(named) and not set(english) & set(named), (path, named)
        chart.close()
        page.locator(".st-key-source label").filter(has_text="上傳照片").click()
        dropzone = page.locator("[data-testid=stFileUploaderDropzone]")
        dropzone.wait_for(timeout=60_000)
        page.wait_for_function("() => document.querySelector('[data-testid=stFileUploaderDropzone]').innerText.includes('上傳')")
        words = dropzone.inner_text()
        assert "上傳" in words and "每個檔案最多 50 MB" in words and "Upload" not in words and "per file" not in words, words
        page.locator(".st-key-source label").filter(has_text="拍一張照片").click()
        camera = page.locator("[data-testid=stCameraInput] button").filter(has_text="拍照")
        camera.wait_for(timeout=60_000)
        assert "Take Photo" not in page.locator("[data-testid=stCameraInput]").inner_text()
        choose_option(page, ".st-key-lang input", page.get_by_role("option", name="English"))
        page.locator("[data-testid=stCameraInput] button").filter(has_text="Take Photo").wait_for(timeout=60_000)
        page.locator(".st-key-source label").filter(has_text="Upload a photo").click()
        page.wait_for_function("() => /50MB per file/.test(document.querySelector('[data-testid=stFileUploaderDropzone]')?.innerText)",
                               timeout=60_000)
        assert "上傳" not in page.locator("[data-testid=stFileUploaderDropzone]").inner_text()
        names = button_names(page, "Help for Smooth heatmap")
        assert "Help for Smooth heatmap" in names and "「平滑熱力圖」的說明" not in names, names  # Streamlit's again
        page.close()
    finally:
        browser.close()
