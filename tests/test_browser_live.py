"""The live camera in a real headless Chromium with its fake camera, against the real server."""
from __future__ import annotations

import re

import numpy as np
import pytest

from attnviz import render
from serve import TEST_CAMERA_FLAGS, chromium, quiet, require_chromium, shot, streamlit_server

GRID = 14  # the offline model at 196 px: 14 × 14 patches
INFERNO = render.colorize(np.linspace(0.0, 1.0, 256), "inferno").astype(np.int32)  # (256, 3)

# Draw the output <video> onto a canvas and read each patch: the centre colour and the spread of colours
# over the inner half of the patch (a flat heatmap square at opacity 1 has almost none).
READ_VIDEO = """(grid) => {
  const v = document.querySelector('video');
  if (!v || v.videoWidth === 0 || v.readyState < 2) return null;
  const c = document.createElement('canvas');
  c.width = v.videoWidth; c.height = v.videoHeight;
  const g = c.getContext('2d');
  g.drawImage(v, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const cell = c.width / grid, centres = [], spreads = [];
  const at = (x, y) => { const i = (Math.floor(y) * c.width + Math.floor(x)) * 4; return [d[i], d[i + 1], d[i + 2]]; };
  for (let r = 0; r < grid; r++) for (let k = 0; k < grid; k++) {
    const cx = (k + 0.5) * cell, cy = (r + 0.5) * cell, centre = at(cx, cy);
    let spread = 0;
    for (const [dx, dy] of [[-1, -1], [1, -1], [-1, 1], [1, 1]]) {
      const p = at(cx + dx * cell / 4, cy + dy * cell / 4);
      spread = Math.max(spread, ...p.map((x, j) => Math.abs(x - centre[j])));
    }
    centres.push(centre); spreads.push(spread);
  }
  return {width: c.width, height: c.height, centres, spreads};
}"""


BUSY = "The live camera is busy: this server runs 1 at once"


@pytest.fixture(scope="module")
def server():
    require_chromium()
    # one stream at a time, so the cap is reached with two pages; every test here ends its streams
    with streamlit_server(env={"ATTNVIZ_LIVE_STREAMS": "1"}) as (url, _proc):
        yield url


def webrtc_frame(page):
    page.wait_for_selector("iframe[title*='webrtc']", timeout=120_000)
    return next(f for f in page.frames if "webrtc" in f.url)


def read_video(frame, timeout_s: float = 60):
    frame.wait_for_function(f"() => ({READ_VIDEO})({GRID}) !== null", timeout=timeout_s * 1000)
    got = frame.evaluate(f"({READ_VIDEO})({GRID})")
    return np.array(got["centres"], dtype=np.int32), np.array(got["spreads"]), (got["width"], got["height"])


def inferno_distance(colours: np.ndarray) -> np.ndarray:
    """How far each RGB colour is from the nearest inferno colour (max over channels)."""
    return np.abs(colours[:, None, :] - INFERNO[None]).max(-1).min(-1)


def told_busy(page, others=(), timeout: float = 90_000) -> None:
    """Wait for the sentence that every stream slot is taken; when it does not come, fail with what the page and
    the ``others`` (pages that should hold the slots) show instead."""
    try:
        page.get_by_text(BUSY).wait_for(timeout=timeout)
    except Exception as e:
        seen = [p.locator("[data-testid='stMain']").inner_text(timeout=5_000)[-600:] for p in (page, *others)]
        raise AssertionError(f"no '{BUSY}'; the pages showed: {seen}") from e


def live_caption(page) -> str:
    page.get_by_text("heatmaps per second").wait_for(timeout=60_000)
    return page.get_by_text("heatmaps per second").inner_text()


def open_live(page) -> None:
    page.get_by_text("Live camera", exact=True).click(timeout=120_000)
    page.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Start").click(timeout=60_000)


@pytest.mark.browser
def test_live_stream_follows_layer_and_freezes_into_a_capture(server):
    with chromium(TEST_CAMERA_FLAGS) as browser:
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(server)
        # opacity 1: every patch of the video is a flat square of colour-map colour
        page.get_by_role("slider", name="Heatmap opacity").focus(timeout=120_000)
        page.keyboard.press("End")
        page.get_by_test_id("stSliderThumbValue").get_by_text("1.00").wait_for()
        open_live(page)
        frame = webrtc_frame(page)
        assert re.match(r"Layer 12, mean of all heads · [\d.]+ heatmaps per second", live_caption(page))

        centres, spreads, size = read_video(frame)
        assert size == (392, 392)  # our square heatmap, not the 4:3 camera picture
        assert np.median(inferno_distance(centres)) <= 12  # colour-map colours (after video compression)
        assert np.median(spreads) <= 16  # each patch one flat colour: the patch grid is there
        layer12 = [centres]
        for _ in range(3):  # the fake camera moves: frames at one layer differ a little from each other
            page.wait_for_timeout(400)
            layer12.append(read_video(frame)[0])
        shot(page, "live_layer12")

        # Layer 1 applies to the next frames, with no restart of the stream
        slider = page.get_by_role("slider", name="Layer")
        for _ in range(5):  # a key pressed while the page re-runs can be lost: press again
            slider.press("Home")
            try:
                page.wait_for_function("s => document.querySelector(s).getAttribute('aria-valuenow') === '1'",
                                       arg="[role='slider'][aria-label='Layer']", timeout=3_000)
                break
            except Exception:
                continue
        page.get_by_text("Layer 1, mean of all heads ·").wait_for(timeout=60_000)
        page.wait_for_timeout(500)
        layer1, spreads1, _ = read_video(frame)
        assert np.median(inferno_distance(layer1)) <= 12 and np.median(spreads1) <= 16
        layers1 = [layer1]
        for _ in range(3):
            page.wait_for_timeout(400)
            layers1.append(read_video(frame)[0])

        def mean_diff(a, b) -> float:
            return float(np.abs(a - b).mean())

        # What the camera's motion alone changes between frames of one layer, against what changes between
        # frames of the two layers (each averaged over the pairs, so one odd frame does not decide).
        within = [mean_diff(a, b) for frames in (layer12, layers1) for i, a in enumerate(frames) for b in frames[i + 1:]]
        across = [mean_diff(a, b) for a in layer12 for b in layers1]
        motion, change = float(np.mean(within)), float(np.mean(across))
        print(f"live layer change {change:.1f} vs motion {motion:.1f}")
        assert change > max(1.25 * motion, 2), (change, motion)
        assert page.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Stop").is_visible()
        shot(page, "live_layer1")

        # Freeze: the stream stops and the frame becomes an ordinary capture with the normal views
        page.get_by_role("button", name="Freeze").click()
        page.get_by_text("Layer 1, mean of all heads: where the class token looks").wait_for(timeout=60_000)
        page.get_by_text(re.compile(r"Showing the frame frozen at \d\d:\d\d:\d\d")).wait_for()
        page.wait_for_selector("[data-testid='stImage'] img", timeout=60_000)
        from playwright.sync_api import expect

        # the camera's component draws its Start button again after the rerun (on a busy host, after the picture)
        expect(page.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Start")).to_be_visible(timeout=30_000)
        assert page.locator("[data-testid='stException']").count() == 0
        shot(page, "live_frozen", full_page=True)


@pytest.mark.browser
def test_refused_camera_gives_one_sentence(server):
    # a camera exists, but the browser refuses it to the page (as a person who clicks "Block")
    with chromium(["--use-fake-device-for-media-stream", "--deny-permission-prompts"]) as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(server)
        open_live(page)
        page.get_by_text("The camera was refused: allow this page to use it").wait_for(timeout=30_000)
        assert page.locator("[data-testid='stException']").count() == 0
        frame = webrtc_frame(page)
        assert "NotAllowedError" not in frame.inner_text("body")  # the English error is hidden
        # WebRTC that cannot connect: the component's own warning (English) becomes our sentence
        frame.evaluate("""() => document.querySelectorAll('[role="alert"]').forEach((a) => { a.textContent =
            'Connection is taking longer than expected. Check your network or ask the developer for STUN/TURN settings'; })""")
        page.get_by_text("The video stream could not connect to the server").wait_for(timeout=30_000)
        # the still-photo path is untouched
        page.get_by_text("Sample photo", exact=True).click()
        page.wait_for_selector("[data-testid='stImage'] img", timeout=60_000)
        page.get_by_text("Layer 12, mean of all heads: where the class token looks").wait_for()


@pytest.mark.browser
def test_a_visitor_over_the_stream_cap_is_told_and_gets_the_slot_when_it_frees(server):
    """Two visitors on a one-stream server: the second, who pressed Start last, is told why nothing
    streams; when the first closes the tab, the second's Start comes back and streams."""
    with chromium(TEST_CAMERA_FLAGS) as browser:
        first, second = (browser.new_context(viewport={"width": 1280, "height": 900}).new_page() for _ in range(2))
        for page in (first, second):  # both see Start while the slot is free
            page.goto(server)
            page.get_by_text("Live camera", exact=True).click(timeout=120_000)
            page.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Start").wait_for(timeout=60_000)
            quiet(page)  # no rerun still to come that would redraw the page once the slot is taken
        first.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Start").click()
        live_caption(first)  # the first visitor's heatmaps stream

        # the second presses the Start it was shown before the slot went: one sentence, no stream
        second.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Start").click()
        told_busy(second, [first])
        second.wait_for_selector("iframe[title*='webrtc']", state="detached", timeout=30_000)  # no Start to press
        assert second.get_by_text("heatmaps per second").count() == 0
        assert second.locator("[data-testid='stException']").count() == 0
        assert "heatmaps per second" in live_caption(first)  # the first visitor streams on, untouched

        # a visitor who opens the page now is told at once, with no Start to press
        third = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        third.goto(server)
        third.get_by_text("Live camera", exact=True).click(timeout=120_000)
        told_busy(third, [first])
        third.context.close()

        first.context.close()  # the first visitor's tab goes away: its slot is freed
        open_start = second.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Start")
        open_start.click(timeout=60_000)  # Start came back by itself
        assert re.match(r"Layer 12, mean of all heads · [\d.]+ heatmaps per second", live_caption(second))
        assert second.get_by_text(BUSY).count() == 0
        second.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Stop").click()
