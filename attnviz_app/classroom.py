"""Streamlit wiring for a classroom: the presenter view, phones, and the box students join from.

Only layout lives here (CSS, a few lines of browser script, the join box); every number still comes
from :mod:`attnviz`. The script is plain DOM work that Streamlit cannot do from Python: scrolling a
new heatmap into view and closing the phone sidebar after a page link.
"""
from __future__ import annotations

import io
import os

import streamlit as st

from . import links
from .text import t

PRESENT_KEY = links.PRESENT  # session key of the toggle and name of the URL parameter (?present=1)
NARROW_BELOW = 768  # px: Streamlit's own breakpoint for the overlaying sidebar


def presenting(help_key: str = "classroom.present_help") -> bool:
    """Sidebar toggle "Presenter view", kept in step with the URL parameter ``?present=1`` so the
    teacher can bookmark it or open it straight on the projector; ``help_key``: what it does on this page."""
    wanted = st.query_params.get(PRESENT_KEY) == "1"
    if st.session_state.get("_present_url") != wanted:  # the URL changed (or first run): it decides
        st.session_state[PRESENT_KEY] = wanted
        st.session_state["_present_url"] = wanted
    on = st.sidebar.toggle(t("classroom.present"), key=PRESENT_KEY, help=t(help_key))
    if on != wanted:
        if on:
            st.query_params[PRESENT_KEY] = "1"
        else:
            st.query_params.pop(PRESENT_KEY, None)
        st.session_state["_present_url"] = on
    return on


def beginner_mode() -> bool:
    """Sidebar toggle "Beginner mode" (``?beginner=1``, kept in the address and the QR code): a first lesson's few
    views, the facts in one line, the model's settings folded away. Off, everything is back."""
    return st.sidebar.toggle(t("classroom.beginner"), key=links.BEGINNER, help=t("classroom.beginner_help"))


def leave_button(place) -> None:
    """The presenter view's way out (its sidebar, with the toggle, is hidden), at the top of ``place``."""
    place.button(t("classroom.leave"), key="leave_present", on_click=leave_presenting, type="tertiary",
                 icon=":material/close_fullscreen:")


def leave_presenting() -> None:
    """Button callback: back to the ordinary page (the sidebar is hidden while presenting)."""
    st.session_state[PRESENT_KEY] = False
    st.session_state["_present_url"] = False
    st.query_params.pop(PRESENT_KEY, None)


def narrow() -> bool:
    """A phone, by its browser's own word ("Mobi" in the User-Agent, as Mozilla recommends): the server
    draws clickable charts to fit a 358 px column. CSS below keeps everything else inside the screen."""
    try:
        return "Mobi" in (st.context.headers.get("User-Agent") or "")
    except Exception:  # no browser (AppTest): a desktop
        return False


# Phones: pictures and charts never wider than their column, and touch targets ≥ 40 px.
# Presenter view: no chrome, a projector-sized type scale (labels and numbers ≥ 20 px).
BASE_CSS = """
[data-testid="stImage"] img, [data-testid="stImageContainer"], [data-testid="stImageCaption"] {
  max-width: 100%; height: auto; }
.katex-display { overflow-x: auto; overflow-y: hidden; }
[data-testid="stVegaLiteChart"], [data-testid="stDataFrame"], [data-testid="stMarkdownContainer"] {
  max-width: 100%; overflow-x: auto; }
/* An SVG chart wider than its column (a small laptop's, the presenter view's) is scaled down whole: its viewBox keeps
   its shape, and Vega finds what a click hits by the element clicked, so clicks stay right. A canvas chart would
   take clicks at the wrong place once scaled: it scrolls instead. */
[data-testid="stVegaLiteChart"] svg.marks { max-width: 100%; height: auto; }
/* The first screen (1280 × 720): the title on one line, the intro, the photo's source and the Layer, Head and View
   boxes, and the heatmap under them (views' titles a size smaller). */
@media (min-width: 641px) { .block-container { padding-top: 3.5rem; } }
.st-key-intro h1 { font-size: 2.1rem; line-height: 1.3; padding: 0.25rem 0 0.5rem; }
.st-key-intro { gap: 0.5rem; }
.st-key-result h3 { font-size: 1.4rem; padding-top: 0.25rem; }
@media (max-width: 640px) {
  .block-container { padding-left: 1rem; padding-right: 1rem; }
  button, [data-testid="stSelectbox"] [role="group"], [data-testid="stFileUploaderDropzone"] button,
  [data-testid="stSidebarNavLink"] { min-height: 40px; }
  [data-testid="stRadio"] label { min-height: 40px; align-items: center; }
  [data-testid="stSlider"] [role="slider"] { width: 28px; height: 28px; }
  [data-testid="stSlider"] [role="slider"]::before { content: ""; position: absolute; inset: -8px; }
  [data-testid="stTabs"] button[role="tab"] { min-height: 40px; }
  /* a table's cells lose half their padding: the lesson's table of sizes (five columns) then fits 358 px */
  [data-testid="stMarkdownContainer"] :is(th, td) { padding: 0.35rem 0.4rem; }
}
/* A clickable picture with no numbers to show (the plain photo): no "Show data", the first of its toolbar's buttons
   (views/common.py: clickable_picture). */
[class*="st-key-picture_only_"] [data-testid="stElementToolbarButton"]:first-child { display: none; }
/* On a touch screen a chart's toolbar (its data table, a download, full screen) appears at the first tap and stays,
   over the title above the chart; every chart has its own download buttons under it. */
@media (hover: none) {
  [data-testid="stElementContainer"]:has([data-testid="stVegaLiteChart"]) [data-testid="stElementToolbar"] {
    display: none; }
}
"""
PRESENT_CSS = """
[data-testid="stSidebar"], [data-testid="stHeader"], [data-testid="stToolbar"], [data-testid="stExpandSidebarButton"] {
  display: none !important; }
.block-container { padding: 0.75rem 1.25rem 1rem 1.25rem !important; max-width: 100% !important; }
[data-testid="stWidgetLabel"] p, [data-testid="stWidgetLabel"] label { font-size: 22px !important; }
[data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] p { font-size: 20px !important; }
[data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li { font-size: 20px; }
[data-testid="stSelectbox"] input, [data-testid="stSliderThumbValue"], [data-testid="stSliderTickBar"] div,
[data-testid="stRadio"] label p, button p { font-size: 20px !important; }
[data-testid="stHeadingWithActionElements"] h3 { font-size: 28px; padding-top: 0; }
[data-testid="stImage"] img { max-height: calc(100vh - 150px); width: auto; }
/* The class token's heatmap and its colour bar as wide as the screen's height allows (500 px at 720, 860 px at
   1080), leaving room for the title and the scale's numbers. */
.st-key-present_heat [data-testid="stElementContainer"] { max-width: calc(100vh - 220px); }
.st-key-present_heat [data-testid="stImage"] img { max-height: none; }
[data-testid="stImageCaption"] { font-size: 20px !important; }
.st-key-join { border: 2px solid #c8c8c8; border-radius: 0.5rem; padding: 0.5rem 0.75rem; }
/* The QR code: 200 px on a 720 px screen, growing with the screen's height to 320 px (at 1080 px and more) */
.st-key-join [data-testid="stElementContainer"]:has(img), .st-key-join img {
  width: clamp(200px, calc(100vh - 520px), 320px) !important; max-width: 100%; }
.st-key-join code { font-size: 22px; color: #ffffff; background: #2b2b2b; word-break: break-all; }
/* High contrast for a projector in a dark room: light type on near-black (captions 12:1 and more, WCAG's AAA asks
   7:1); the boxes keep Streamlit's own light fields, dark type on light. */
.stApp, [data-testid="stAppViewContainer"], [data-testid="stMain"] { background: #101010; color: #f5f5f5; }
[data-testid="stMarkdownContainer"], [data-testid="stMarkdownContainer"] :is(p, li, span, strong, th, td),
[data-testid="stHeadingWithActionElements"] :is(h1, h2, h3, h4), [data-testid="stWidgetLabel"] :is(p, label),
[data-testid="stRadio"] label p, [data-testid="stExpander"] summary p, [data-testid="stSliderThumbValue"],
[data-testid="stSliderTickBar"] div, [data-testid="stTab"] p { color: #f5f5f5; }
[data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] p, [data-testid="stImageCaption"] {
  color: #d6d6d6 !important; }
[data-testid="stExpander"] details { border-color: #8a8a8a; }
button[kind="secondary"], button[kind="tertiary"] { color: #f5f5f5; }
button[kind="secondary"] { background: #2b2b2b; border-color: #9a9a9a; }
"""
# The lesson on the projector (screens/lesson.py): the controls in one band, the join box's QR code beside its words,
# each step's pictures no taller than the screen under the band and the tabs leaves, formulas as large as the text.
PRESENT_LESSON_CSS = """
.st-key-join [data-testid="stElementContainer"]:has(img), .st-key-join img {
  width: clamp(150px, calc(100vh - 570px), 240px) !important; }
.st-key-join { padding: 0.25rem 0.75rem; }
.st-key-join code { font-size: 20px; overflow-wrap: anywhere; }
.st-key-join [data-testid="stMarkdownContainer"] p { margin-bottom: 0; }
[data-testid="stExpander"] summary p { font-size: 20px; }
[role="tabpanel"] [data-testid="stImage"] img { max-height: calc(100vh - 430px); }
.katex { font-size: 24px !important; }
[role="tabpanel"] .katex-display { margin: 0.3em 0; }
[data-testid="stMarkdownContainer"] p .katex { font-size: 22px !important; }
"""

# Runs once per browser tab (guarded): close the overlaying sidebar after a page link on a phone.
BEHAVIOUR_JS = """
<script>
(() => {
  if (window.__attnvizClassroom) return;
  window.__attnvizClassroom = true;
  const doc = window.document;
  doc.addEventListener("click", (event) => {
    const link = event.target.closest('[data-testid="stSidebar"] a');
    if (!link || window.innerWidth >= %(narrow)d) return;
    // the collapse button exists only while the sidebar is open; the new page may redraw it once
    for (const wait of [100, 400, 1000]) setTimeout(() => {
      const close = doc.querySelector('[data-testid="stSidebarCollapseButton"] button');
      if (close) close.click();
    }, wait);
  }, true);
})();
</script>
"""

# Once this run is over (Streamlit has then removed the previous view's pictures; its app element's
# data-test-script-state says "notRunning"), every 100 ms for up to 20 s: the function ``scroll``, which answers true
# (scrolled), false (not yet: a picture is still loading) or null (nothing to scroll to). After its first true it is
# called for another ``HOLD_MS``, so that a picture or chart laid out late above the target does not push it off the
# screen again; the visitor's own wheel, touch, key or click ends that at once, and so does any other scroll (the
# page's scroll position moved since ours: a layout shift moves the target, not the position). ``window.__attnvizAfterRuns`` counts
# the scripts that have not yet scrolled or given up: the browser tests wait for it to be 0 (tests/serve.py: settle).
HOLD_MS = 1500
AFTER_RUN_JS = """
<script>
(() => {
  const scroll = %(scroll)s;
  const started = Date.now();
  let pending = true, scrolledAt = null, visitor = false, top = null;
  const scroller = () => document.querySelector('[data-testid="stMain"]') || document.scrollingElement;
  window.__attnvizAfterRuns = (window.__attnvizAfterRuns || 0) + 1;
  const settled = () => { if (pending) window.__attnvizAfterRuns -= 1; pending = false; };
  const mine = () => { visitor = true; };
  const inputs = ["wheel", "touchstart", "keydown", "pointerdown"];
  inputs.forEach((type) => window.addEventListener(type, mine, {capture: true, passive: true}));
  const timer = setInterval(() => {
    const now = Date.now();
    const state = document.querySelector("[data-test-script-state]")?.dataset.testScriptState;
    const moved = top !== null && Math.abs(scroller().scrollTop - top) > 2;  // scrolled by someone else
    const over = visitor || moved || now - started > 20000 || (scrolledAt !== null && now - scrolledAt > %(hold)d);
    if (!over && (now - started < 300 || state !== "notRunning")) return;
    const answer = over ? null : scroll();
    if (answer === true && scrolledAt === null) { scrolledAt = now; settled(); }
    if (answer === true) top = scroller().scrollTop;
    if (answer === null || over) {
      settled();
      clearInterval(timer);
      inputs.forEach((type) => window.removeEventListener(type, mine, {capture: true}));
    }
  }, 100);
})(/* %(token)s */);
</script>
"""

# The first large picture of the result into view, as little as needed (on a phone this brings the heatmap up under
# the Layer and Head controls): the view's main picture, not its tallest (the Q/K map's atlas is taller than the map).
# A chart is drawn after the run ends, and a picture laid out once it has decoded: while one of them is still coming
# there is nothing to scroll to yet (false), not nothing at all (null, which ends the script): on a busy phone the
# Query view's picture came after the first look, and stayed below the screen.
SCROLL_TO_PICTURE = """() => {
    const box = document.querySelector(".st-key-result");
    const fresh = (e) => !e.closest('[data-stale="true"]');
    const pictures = box ? [...box.querySelectorAll("img, canvas, svg.marks")].filter(fresh) : [];
    const sized = pictures.map((p) => [p, p.getBoundingClientRect().height]).filter(([p, h]) => h > 120);
    const coming = box && ([...box.querySelectorAll("img")].some((i) => fresh(i) && !i.complete) ||
      [...box.querySelectorAll('[data-testid="stVegaLiteChart"]')].some((c) => fresh(c) && !c.querySelector("svg.marks, canvas")));
    if (!sized.length) return box && !coming ? null : false;
    if (sized.some(([p]) => p.complete === false)) return false;
    const tallest = Math.max(...sized.map(([p, h]) => h));
    const [picture] = sized.find(([p, h]) => h >= tallest / 2);
    picture.scrollIntoView({block: "nearest", behavior: "instant"});
    return true;
  }"""

# The element CSS ``selector`` finds to the top of the screen (a phone opening a link to the lesson's fourth step sees
# that step, not the title two screens above it), and a chosen tab inside it into view sideways.
SCROLL_TO_TOP = """() => {
    const element = document.querySelector('%(selector)s');
    if (!element) return null;
    if (![...document.images].every((i) => i.complete)) return false;  // a picture above may still move it
    element.style.scrollMarginTop = "3.75rem";  // below the page's header bar
    element.scrollIntoView({block: "start", behavior: "instant"});
    element.querySelector('[role="tab"][aria-selected="true"]')?.scrollIntoView({block: "nearest", inline: "nearest"});
    return true;
  }"""


def after_run(scroll: str, token: str = "") -> None:
    """Run the JavaScript function ``scroll`` once this run is drawn (:data:`AFTER_RUN_JS`); ``token`` makes the
    element differ from the last one emitted, so that the browser runs it again."""
    st.html(AFTER_RUN_JS % {"scroll": scroll, "hold": HOLD_MS, "token": token.replace("*/", "")},
            unsafe_allow_javascript=True)


def bring_to_top(selector: str) -> None:
    """Scroll the element CSS ``selector`` finds to the top of the screen, once this run is drawn."""
    after_run(SCROLL_TO_TOP % {"selector": selector.replace("'", "\\'")})


def chrome(present: bool, lesson: bool = False) -> None:
    """The page's CSS and browser behaviour; call once per run, before anything is drawn in the main area.
    ``lesson``: the lesson's page, whose presenter view lays out its steps to fit a 720 px screen."""
    css = BASE_CSS + (PRESENT_CSS + (PRESENT_LESSON_CSS if lesson else "") if present else "")
    st.html(f"<style>{css}</style>")
    st.html(BEHAVIOUR_JS % {"narrow": NARROW_BELOW}, unsafe_allow_javascript=True)


def bring_into_view(token: str) -> None:
    """Scroll the result into view when ``token`` (photo digest and view) differs from this session's last: after the
    visitor's own choice of photo or view, never on the first run, which stays at the top (title, intro and the
    Photo choice are the way in)."""
    last = st.session_state.get("_scrolled_for")
    st.session_state["_scrolled_for"] = token
    if last is not None and last != token:
        after_run(SCROLL_TO_PICTURE, token)


def join_url() -> str:
    """The address students type or scan: ``$ATTNVIZ_JOIN_URL`` (e.g. a proxy's name) or this server's
    address on the room's network."""
    configured = os.environ.get("ATTNVIZ_JOIN_URL")
    if configured:
        return configured
    from streamlit import net_util

    host = net_util.get_internal_ip() or "localhost"
    return f"http://{host}:{st.get_option('server.port')}"


@st.cache_data(show_spinner=False, max_entries=4)
def qr_png(url: str) -> bytes:
    import segno

    buffer = io.BytesIO()
    segno.make(url, error="m").save(buffer, kind="png", scale=6, border=2)
    return buffer.getvalue()


def join_box(linked: dict[str, str], page: str = "") -> None:
    """The address of this page on the room's network, and a QR code that opens it on the view shown
    (``linked``, :func:`attnviz_app.links.choices`), for students' phones. ``page``: the page's path
    (``lesson``), "" for Explore."""
    url = join_url().rstrip("/") + (f"/{page}" if page else "")
    with st.container(key="join"):
        # the lesson's band is a third of the screen: the words get the wider column there
        code, words = st.columns([2, 3] if page else [1, 1], vertical_alignment="center")
        # 41 × 41 modules for a link with the view's choices (29 × 29 for the address alone): 200 px on a 720 px
        # screen, so on a 2.5 m wide projection the code is ~39 cm across, each module ~9 mm
        code.image(qr_png(links.link(url, linked)), width=200)
        words.markdown(t("classroom.join", url=url))
