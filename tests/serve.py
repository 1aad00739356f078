"""Start the real Streamlit server and a real headless Chromium (Debian's), for browser tests and bench/;
and the few Playwright steps the browser tests share: open a page at a screen's size, wait for a run to
end, choose a select box's option or a View, take a screenshot."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> None:
    """Skip a browser test where Debian's chromium is missing; in CI that is a failure of .ci/run."""
    import pytest

    if chromium_path() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("Debian's chromium is missing: .ci/run must install it")
        pytest.skip("chromium is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(
    port: int | None = None, env: dict | None = None, timeout: float = 120, launcher: list[str] | None = None,
    cwd: Path = ROOT, whole_env: bool = False, log_path: Path | None = None,
):
    """Run ``streamlit run app.py`` (a checkout's way) on 127.0.0.1; yield (url, process).

    ``launcher`` replaces ``python -m streamlit run app.py``, e.g. ``ATTNVIZ_APP`` (``attnviz app``, the
    installed way); it is given the server options. ``env`` adds to this process's environment, or with
    ``whole_env`` is the server's whole environment (a fresh venv's: nothing of this one leaks in). ``log_path``
    keeps the server's output, and its end is in the error when the server does not start.
    """
    port = port or free_port()
    log = open(log_path or os.devnull, "w")
    launcher = launcher or [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py")]
    proc = subprocess.Popen(
        [*launcher, "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true"],
        cwd=cwd, env=dict(env or {}) if whole_env else {**os.environ, **(env or {})}, stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                said = f":\n{log_path.read_text()[-3000:]}" if log_path else ""
                raise RuntimeError(f"the Streamlit server did not start (exit status {proc.poll()}){said}")
            time.sleep(0.3)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


ATTNVIZ_APP = [sys.executable, "-m", "attnviz", "app"]  # what `make run` runs: `attnviz app`
FAKE_CAMERA_FLAGS = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
# The live tests' camera: Chromium's fake device at 5 frames a second (the least it offers), not the 20 the page asks for.
# The live worker always takes the newest frame, so a faster camera adds only frames it drops, each of which costs
# CPU (encoding in Chromium, decoding on the server) that the other test worker needs: the live tests' server took
# 28 s of CPU instead of 41 s. bench/ keeps FAKE_CAMERA_FLAGS, a camera at the rate the page asks for.
TEST_CAMERA_FLAGS = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream=fps=5"]


@contextlib.contextmanager
def chromium(extra_args: list[str] = ()):
    """A Playwright browser on Debian's chromium binary (``extra_args``: e.g. ``FAKE_CAMERA_FLAGS``)."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        raise FileNotFoundError("Debian's chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=[*CHROMIUM_FLAGS, *extra_args])
        try:
            yield browser
        finally:
            browser.close()


def choose_option(page, box: str, option) -> None:
    """Open the select box whose input matches CSS ``box`` and click ``option`` (a Playwright locator) in
    its list. A click during a script re-run can be lost or leave the list closed: the list is opened
    again (by click, then by keyboard) up to three times before the option is clicked. The box is scrolled into
    view first: a phone's tap on a box Playwright had to scroll to focused it without opening its list (the Swin
    page's Stage box, above the picture the page scrolls to)."""
    for _ in range(3):
        # to the middle of the screen, as a person scrolls before opening a list: at the screen's edge its options
        # open off screen, and Playwright's scroll to an option closes the list (it redraws on scroll)
        page.locator(box).first.evaluate("e => e.scrollIntoView({block: 'center', behavior: 'instant'})")
        page.wait_for_timeout(200)
        page.locator(box).first.click()
        if not option.count():
            page.keyboard.press("ArrowDown")  # a click that focused the box without opening its list (docs/qk-map.md)
        try:
            option.wait_for(timeout=5_000)
            break
        except Exception:
            page.keyboard.press("Escape")
    option.click()


PHONE_UA = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
            "Version/17.5 Mobile/15E148 Safari/604.1")
SCREENS = {  # the screens the page is tested on, as Playwright browser-context options
    "desktop": {"viewport": {"width": 1400, "height": 1000}},
    "projector": {"viewport": {"width": 1280, "height": 720}},
    "phone": {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True,
              "user_agent": PHONE_UA, "device_scale_factor": 2},
}
SHOTS = Path(os.environ["ATTNVIZ_SHOTS"]) if os.environ.get("ATTNVIZ_SHOTS") else None


# What a kept page clears as it leaves: a new context's page starts with no storage (and no cookies, cleared apart).
LEAVE_JS = "() => { try { localStorage.clear(); sessionStorage.clear(); } catch (e) {} }"


def open_page(browser, screen: str, **options):
    """A page in a browser context of its own, sized as ``screen`` (a key of ``SCREENS``); ``options`` add
    to or replace the screen's (``device_scale_factor=1``, ``accept_downloads=True``).

    ``page.close()`` keeps the page for this browser's next ``open_page`` of the same screen and options, as a
    visitor who opens the next address in the same tab: it leaves for about:blank (the server sees its session end,
    as when a tab closes), its cookies and storage cleared and its pointer moved off the page. A page opened anew
    cost Chromium 2.7 s of CPU here, one kept 1.3 s (the page's first screen, docs/tests.md).
    ``page.context.close()`` closes it for good."""
    settings = {**SCREENS[screen], **options}
    key = repr(sorted(settings.items()))
    if not hasattr(browser, "attnviz_kept_pages"):
        browser.attnviz_kept_pages = {}
    kept = browser.attnviz_kept_pages.setdefault(key, [])
    while kept:
        page = kept.pop()
        if not page.is_closed():
            return page
    page = browser.new_page(**settings)
    close_for_good = page.close

    def leave(**_options) -> None:
        if page.is_closed():
            return
        try:
            page.mouse.move(0, 0)
            page.evaluate(LEAVE_JS)
            page.goto("about:blank")
            page.context.clear_cookies()
        except Exception:  # a page that cannot leave (crashed, its context closed) is not kept
            close_for_good()
            return
        kept.append(page)

    page.close = leave
    return page


def shot(page, name: str, full_page: bool = False) -> None:
    """Save a screenshot of the screen (or the whole page) as ``name``.png in the folder ``ATTNVIZ_SHOTS`` names, if
    it names one: to look at, not to test (a test that reads pixels takes its own)."""
    if SHOTS is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SHOTS / f"{name}.png", full_page=full_page)


SETTLED_JS = """(ms) => {
  const state = document.querySelector("[data-test-script-state]")?.dataset.testScriptState;
  const now = performance.now();
  const busy = state !== "notRunning" || (window.__attnvizAfterRuns || 0) > 0 ||
    ![...document.images].every(i => i.complete);
  if (busy || window.__attnvizSettledFrom === undefined) window.__attnvizSettledFrom = now;
  return now - window.__attnvizSettledFrom >= ms;
}"""
SETTLED_MS = 250  # a click's rerun has begun well within this on one machine (its message goes over localhost)


def settle(page) -> None:
    """Wait until the page's script run is over (Streamlit's app element says "notRunning"), its pictures are
    loaded and its after-run scripts (attnviz_app/classroom.py: AFTER_RUN_JS) have each had their first try, all
    of which has stayed so for ``SETTLED_MS``: a run an action has just asked for may not have begun yet."""
    page.evaluate("() => { delete window.__attnvizSettledFrom; }")
    page.wait_for_function(SETTLED_JS, arg=SETTLED_MS, polling=50, timeout=120_000)


QUIET_JS = """(ms) => {
  const state = document.querySelector("[data-test-script-state]")?.dataset.testScriptState;
  const now = performance.now();
  if (state !== "notRunning" || window.__attnvizBusyAt === undefined) window.__attnvizBusyAt = now;
  return now - window.__attnvizBusyAt >= ms;
}"""


def quiet(page, seconds: float = 1.5) -> None:
    """Wait until the page's script has not run for ``seconds``: a component's first report can rerun a
    page just after it looks ready, and a step that races that rerun sees the page it replaces."""
    page.wait_for_function(QUIET_JS, arg=seconds * 1000, polling=100, timeout=120_000)


def pick(page, key: str, label: str, exact: bool = False) -> None:
    """Choose ``label`` in the select box of widget key ``key``: the option of that name (``exact``) or the
    first whose text holds it. The page settles before (a run still going would redraw the box and close
    its list again) and after."""
    selector = f".st-key-{key} input"
    settle(page)
    page.wait_for_function("s => document.querySelectorAll(s).length === 1", arg=selector, timeout=60_000)  # no stale copy
    options = page.get_by_role("option")
    choose_option(page, selector, options.filter(has_text=label).first if not exact else
                  page.get_by_role("option", name=label, exact=True))
    settle(page)


def download(page, button, timeout: float = 60_000):
    """Click ``button`` (a Playwright locator) and return the Download it starts. The page is quiet first: a
    click during a re-run can land on a button that is being replaced and start nothing, so a click that
    starts no download within 20 s is made again (twice at most); the last waits ``timeout`` ms."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(3):
        quiet(page)
        try:
            with page.expect_download(timeout=20_000 if attempt < 2 else timeout) as info:
                button.click()
            return info.value
        except PlaywrightTimeout:
            if attempt == 2:
                raise


DRAWN_JS = """([selector, ms]) => {
  const drawn = document.querySelector(selector)?.querySelector('canvas, svg.marks');
  const r = drawn ? drawn.getBoundingClientRect() : null;
  const key = r && r.width > 0 && r.height > 0 ? [r.x, r.y, r.width, r.height].join() : null;
  const now = performance.now();
  if (key === null || key !== window.__attnvizDrawn) { window.__attnvizDrawn = key; window.__attnvizDrawnAt = now; }
  return key !== null && now - window.__attnvizDrawnAt >= ms;
}"""


def drawn(page, selector: str, ms: int = 300) -> None:
    """Wait until the chart inside the first element ``selector`` matches is drawn (its canvas or SVG has a size) and
    has kept its place and size for ``ms``: Vega lays a chart out once its data has arrived, and again as its column
    settles, so a click aimed from its box before then can miss."""
    page.wait_for_function(DRAWN_JS, arg=[selector, ms], polling=50, timeout=60_000)


SHOWN = {  # what a view's result shows once it is drawn, besides its picture
    "query": ".st-key-result [data-stale='false'] [data-testid='stVegaLiteChart']",
    "heads": ".st-key-result [data-stale='false'] [data-testid='stVegaLiteChart']",
    "stats": ".st-key-result [data-testid='stVegaLiteChart']",
    "relevance": ".st-key-result [data-testid='stAlertContentInfo']",
}
NO_PICTURE = ("stats", "relevance")  # views whose result has no picture over 120 px tall
BIG_PICTURE = """() => [...document.querySelectorAll('.st-key-result img, .st-key-result canvas, .st-key-result svg.marks')]
  .some(p => p.getBoundingClientRect().height > 120 && p.complete !== false && !p.closest('[data-stale="true"]'))"""

# The page's widths and the largest picture or chart of the view's result (its box: heat).
MEASURE = """() => {
  const box = document.querySelector('.st-key-result');
  const all = box ? [...box.querySelectorAll('img, canvas, svg.marks')].filter(
    p => p.closest('[data-stale="true"]') === null) : [];  // not what the previous run left
  // the view's main picture: its first big one, as the page scrolls to it (classroom.SCROLL_TO_PICTURE)
  const sized = all.map(p => p.getBoundingClientRect()).filter(r => r.height > 120);
  const tallest = Math.max(0, ...sized.map(r => r.height));
  const big = sized.filter(r => r.height >= tallest / 2);
  const main = document.querySelector('[data-testid="stMain"]');
  // charts drawn wider than their box, and data frames whose columns are: the page's CSS lets the box scroll
  // sideways, so their right part is cut off (a hidden tab's are 0 wide)
  const clipped = [...document.querySelectorAll('[data-testid="stVegaLiteChart"], [data-testid="stDataFrame"]')].map(box => {
    const drawn = box.querySelector(box.dataset.testid === 'stDataFrame' ? '.dvn-stack' : 'canvas, svg.marks');
    return drawn ? [Math.round(box.getBoundingClientRect().width), Math.round(drawn.getBoundingClientRect().width)] : null;
  }).filter(sizes => sizes && sizes[1] > sizes[0] + 1);
  return {vw: window.innerWidth, vh: window.innerHeight, page: document.documentElement.scrollWidth, clipped,
          main: main ? main.scrollWidth : 0, heat: big.length ? {top: big[0].top, bottom: big[0].bottom,
          left: big[0].left, right: big[0].right, height: big[0].height} : null};
}"""


def choose_view(page, label: str, view: str | None = None) -> None:
    """Choose ``label`` in the View box, wait until the box shows it and the page settles. ``view``, the
    view's key, also waits for its result to be drawn (``SHOWN``; a picture over 120 px tall that is not
    the previous run's) before the page settles."""
    choose_option(page, ".st-key-view input", page.get_by_role("option").filter(has_text=label).first)
    page.locator(f".st-key-view input[value^='{label[:12]}']").wait_for(timeout=30_000)
    if view in SHOWN:
        page.locator(SHOWN[view]).first.wait_for(timeout=120_000)
    if view is not None and view not in NO_PICTURE:
        page.wait_for_function(BIG_PICTURE, timeout=120_000)
    settle(page)
