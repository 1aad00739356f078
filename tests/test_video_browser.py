"""The page's video source and vector downloads in a real Chromium against the real server: upload a clip,
see it processed with a progress bar, play it, scrub, freeze a frame into the ordinary views, download
the MP4; download the class-token map as SVG. In English and in 繁體中文; with ``ATTNVIZ_SHOTS=folder``,
screenshots at three sizes."""
from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET

import pytest

av = pytest.importorskip("av")

from serve import SCREENS, SHOTS, download, open_page, pick, shot, streamlit_server
from video_fixtures import write_clip


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    # 12 frames at 12 fps: 1 s of moving shapes, a phone's rotation in the display matrix
    return write_clip(tmp_path_factory.mktemp("clip") / "phone.mov", 12, fps=12, width=320, height=240, rotation=90)


def pick_source(page, label: str) -> None:
    page.locator("[data-testid='stRadio']").filter(has_text=label).get_by_text(label, exact=True).click(timeout=180_000)


@pytest.mark.browser
@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_upload_play_scrub_freeze_and_download(app_in_chromium, clip, tmp_path, lang):
    words = {
        "en": dict(source="Video", freeze="Freeze this frame", frame="Frame", download="Download the video (MP4, H.264)",
                   note="every frame of phone.mov (12 fps → 12 fps)", frozen="Exploring phone-frame",
                   svg="Download as SVG (vector)", title="Layer 12, mean of all heads: where the class token looks"),
        "zh-TW": dict(source="影片", freeze="定格這個畫面", frame="畫面", download="下載影片（MP4，H.264）",
                      note="取自 phone.mov 的每一格（12 fps → 12 fps）", frozen="正在探索從影片定格的 phone-frame",
                      svg="下載 SVG（向量圖）", title="第 12 層，所有注意力頭的平均：類別 token 看向哪裡"),
    }[lang]
    page_server, browser = app_in_chromium
    page = open_page(browser, "desktop", accept_downloads=True)
    page.goto(page_server)
    if lang == "zh-TW":  # once the page has drawn (its first run loads the model), switch the language
        page.locator("[data-testid='stRadio']").filter(has_text="Live camera").wait_for(timeout=180_000)
        pick(page, "lang", "繁體中文", exact=True)
    pick_source(page, words["source"])
    page.locator("input[type=file]").set_input_files(str(clip))
    page.locator("[data-testid='stVideo']").wait_for(timeout=300_000)  # processed through the job queue
    page.get_by_text(words["note"], exact=False).wait_for()
    # it plays: the browser decodes our H.264 and the clock moves
    playing = page.evaluate("""async () => {
        const v = document.querySelector("[data-testid='stVideo']");
        v.muted = true; await v.play(); await new Promise(r => setTimeout(r, 600));
        return {time: v.currentTime, w: v.videoWidth, h: v.videoHeight, d: v.duration};
    }""")
    assert playing["time"] > 0 and playing["w"] == playing["h"] == 392
    assert playing["d"] == pytest.approx(1.0, abs=0.1)
    # scrub: the still under the scrubber becomes frame 7 of 12
    slider = page.get_by_role("slider", name=words["frame"]).first  # while a rerun redraws it, there are two
    for _ in range(40):  # a key pressed while a rerun redraws the slider can be lost: press until it says 7
        now = int(slider.input_value())  # an <input type=range>
        if now == 7:
            break
        slider.focus()
        page.keyboard.press("ArrowRight" if now < 7 else "ArrowLeft")
        page.wait_for_timeout(150)
    page.get_by_text("7 / 12" if lang == "zh-TW" else "Frame 7 of 12", exact=False).wait_for(timeout=60_000)
    mp4 = tmp_path / "result.mp4"
    download(page, page.get_by_text(words["download"])).save_as(mp4)
    with av.open(str(mp4)) as c:
        assert c.streams.video[0].frames == 12 and "phone.mov" in c.metadata["comment"]
    if lang == "zh-TW":
        shot(page, "video_zh-TW_desktop")
    if lang == "en" and SHOTS is not None:
        for name, screen in SCREENS.items():
            page.set_viewport_size(screen["viewport"])
            page.wait_for_timeout(500)
            shot(page, f"video_{name}")
        page.set_viewport_size(SCREENS["desktop"]["viewport"])
    # freeze: the ordinary views now show input frame 7 (upright: 240 wide, 320 tall)
    page.get_by_role("button", name=words["freeze"]).click()
    page.get_by_text(words["frozen"], exact=False).wait_for(timeout=120_000)
    page.get_by_text(words["title"]).wait_for(timeout=180_000)
    assert page.locator("[data-testid='stException']").count() == 0
    svg = tmp_path / "map.svg"
    download(page, page.get_by_role("button", name=words["svg"])).save_as(svg)
    root = ET.parse(svg).getroot()
    groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if (g.get("id") or "").startswith("heatmap-")]
    assert len(groups) == 1 and len(list(groups[0].iter("{http://www.w3.org/2000/svg}path"))) == 14 * 14
    shot(page, f"video_frozen_{lang}", full_page=True)
    page.close()


def cpu_seconds(pid: int) -> float:
    """User and system time the process has used so far (Linux's /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy(pid: int, seconds: float = 3.0) -> float:
    """CPU seconds the process used over the next ``seconds`` of wall time."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return cpu_seconds(pid) - before


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads the server's CPU time from /proc")
def test_closing_the_tab_stops_its_video_job(app_in_chromium, tmp_path):
    """A video job nobody waits for any more stops (Streamlit's runtime says the tab's session is gone, and
    the job asks at every packet): the server goes idle within seconds of the tab closing, and the next
    visitor on a one-job server gets their video without waiting the long one out. Before, such a job ran
    on for minutes after its visitor had left."""
    _, browser = app_in_chromium  # this module's Chromium, on a server of its own
    long = write_clip(tmp_path / "long.mp4", 1800, fps=30, width=64, height=48)  # 60 s: 1800 passes of the model
    short = write_clip(tmp_path / "short.mp4", 4, fps=4, width=64, height=48)
    with streamlit_server(env={"ATTNVIZ_HEAVY_JOBS": "1"}) as (url, proc):
        first = open_page(browser, "desktop")
        first.goto(url)
        pick_source(first, "Video")
        first.locator("input[type=file]").set_input_files(str(long))
        first.get_by_text("Drawing the heatmap on every frame:", exact=False).wait_for(timeout=300_000)
        running = busy(proc.pid)
        first.context.close()
        time.sleep(2)  # the server sees the socket close; the job ends at its next packet
        after = busy(proc.pid)
        print(f"server CPU over 3 s: {running:.2f} s while the job ran, {after:.2f} s after its tab closed")
        assert running > 1.0  # the job runs: model passes on a core or more
        assert after < 0.5  # idle: the job stopped, not drawing the rest of its 1800 frames
        second = open_page(browser, "desktop")
        second.goto(url)
        pick_source(second, "Video")
        second.locator("input[type=file]").set_input_files(str(short))
        second.get_by_text("every frame of short.mp4", exact=False).wait_for(timeout=120_000)
        assert second.locator("[data-testid='stException']").count() == 0
