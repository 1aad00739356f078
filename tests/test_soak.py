"""Many uploads through one server process: bounded memory, no hooks added, no temporary files, nothing on disk.

Short by default (20 uploads); ``--slow`` runs the full 200. Both count the live captures and decoded
photos in the server (a leak of one per upload shows at once); the full run also bounds the growth of
resident memory, which moves by tens of MB from upload to upload as the allocator keeps or returns
pages, too much to judge from a handful of uploads. The measured figures are printed.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import statistics
import sys
import time
from pathlib import Path

import psutil
import pytest
from PIL import PngImagePlugin

from conftest import holds, written_since
from serve import streamlit_server
from attnviz_app.ui import CAPTURE_CACHE_ENTRIES, IMAGE_CACHE_ENTRIES
from test_browser_load import HEATMAP, open_upload, require_chromium

from make_corpus import photo

ROOT = Path(__file__).resolve().parents[1]
PORT = 8642
WARM_UP = 14  # fills the capture cache (12 entries) before memory is measured
GROWTH_LIMIT_MB = 50  # full run: median of the last 10 uploads' RSS against the first 10 after warm-up

# Runs the real server, plus a thread that, whenever "<report>.ask" appears, writes to <report> how many
# torch modules, hooks on them, layers of networks attnviz wrapped, captures and decoded photos are alive.
LAUNCHER = """
import gc, json, os, sys, threading, time, runpy
report = sys.argv[1]
def answer():
    while True:
        time.sleep(0.2)
        if os.path.exists(report + ".ask") and "torch" in sys.modules:
            import torch
            for _ in range(25):  # a freeze on another thread (tuning's housekeeping) between these lines hides all
                gc.unfreeze()  # the app freezes its long-lived objects (ui.cached_model): count those too
                gc.collect()
                live = gc.get_objects()
                gc.freeze()
                modules = [o for o in live if isinstance(o, torch.nn.Module)]
                if modules:  # the server holds the model: none seen is such a freeze, not an answer
                    break
                time.sleep(0.2)
            hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in modules)
            wrapped = sum(len(m.blocks) for m in modules if "_attnviz_tap" in m.__dict__)
            names = [type(o).__name__ for o in live]
            with open(report + ".tmp", "w") as f:
                json.dump({"modules": len(modules), "hooks": hooks, "layers": wrapped,
                           "captures": names.count("Capture"),
                           "photos": names.count("CheckedImage")}, f)
            os.replace(report + ".tmp", report)
            os.unlink(report + ".ask")
threading.Thread(target=answer, daemon=True).start()
sys.argv = ["streamlit", "run", sys.argv[2], *sys.argv[3:]]
runpy.run_module("streamlit", run_name="__main__")
"""


def probed_server(port: int, report: Path, tmpdir: Path):
    """The real server, started through LAUNCHER so the test can ask it how many hooks are attached."""
    return streamlit_server(port, env={"TMPDIR": str(tmpdir)}, launcher=[sys.executable, "-c", LAUNCHER, str(report), str(ROOT / "app.py")])


def server_probe(proc: subprocess.Popen, report: Path) -> dict:
    report.unlink(missing_ok=True)
    Path(f"{report}.ask").touch()
    deadline = time.monotonic() + 30
    while not report.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not answer the hook probe")
        time.sleep(0.1)
    return json.loads(report.read_text())


def upload_bytes(i: int, token: str) -> bytes:
    """Upload number ``i``: a different photo each time, carrying ``token`` so disk copies can be found."""
    info = PngImagePlugin.PngInfo()
    info.add_text("upload-token", token)
    buffer = io.BytesIO()
    photo(320 + i % 7 * 16, 240 + i % 5 * 16, seed=1000 + i).save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


def rss_mb(proc: subprocess.Popen) -> float:
    return psutil.Process(proc.pid).memory_info().rss / 2**20


@pytest.mark.browser
@pytest.mark.parametrize("uploads", [
    20, pytest.param(200, marks=[pytest.mark.slow, pytest.mark.timeout(2400)]),
], ids=["short", "full"])
def test_soak(uploads, tmp_path):
    require_chromium()
    from serve import chromium

    token = secrets.token_hex(12)
    server_tmp = tmp_path / "server_tmp"
    server_tmp.mkdir()
    report = tmp_path / "hooks.json"
    since = time.time() - 1
    warm = WARM_UP
    with probed_server(PORT, report, server_tmp) as (url, proc), chromium() as browser:
        temp_before = set(os.listdir(server_tmp))
        page = open_upload(browser.new_context(viewport={"width": 1300, "height": 1000}), url)
        previous, rss = None, []  # resident MB after each upload from the end of the warm-up on
        for i in range(uploads):
            page.locator("input[type=file]").set_input_files(
                files=[{"name": f"soak_{i}.png", "mimeType": "image/png", "buffer": upload_bytes(i, token)}])
            page.wait_for_function(
                "([s, old]) => { const i = document.querySelector(s); return i && i.src !== old && i.complete; }",
                arg=[HEATMAP, previous], timeout=120_000)
            previous = page.locator(HEATMAP).first.get_attribute("src")
            assert page.locator("[data-testid='stException']").count() == 0
            if i + 1 >= warm:
                rss.append(rss_mb(proc))
        page.wait_for_timeout(1000)  # let the last run finish releasing its objects
        probe = server_probe(proc, report)
        temp_after = set(os.listdir(server_tmp))
    ends = min(10, len(rss) // 2)
    growth = statistics.median(rss[-ends:]) - statistics.median(rss[:ends])
    print(f"\nsoak: {uploads} uploads; server RSS {rss[0]:.0f} MB after {warm} warm-up uploads, {rss[-1]:.0f} MB "
          f"at the end, median growth {growth:+.1f} MB (from {min(rss):.0f} to {max(rss):.0f} MB on the way); "
          f"live captures {probe['captures']}, decoded photos {probe['photos']}; hooks attached: "
          f"{probe['hooks']} on {probe['modules']} modules ({probe['layers']} wrapped layers); "
          f"new temporary files: {len(temp_after - temp_before)}; "
          f"RSS every 20 uploads: {[round(r) for r in rss[::20]]} MB")
    # wrap() hooks q, k, the residual stream and the head switch of every layer once (the default model: 12
    # layers); a capture adds none, so 20 or 200 uploads leave exactly those
    assert probe["modules"] > 100 and probe["layers"] >= 12 and probe["hooks"] == 4 * probe["layers"]
    # what the caches may hold, plus the session's own current photo and capture
    assert 1 <= probe["captures"] <= CAPTURE_CACHE_ENTRIES + 1
    assert 1 <= probe["photos"] <= IMAGE_CACHE_ENTRIES + 1
    assert temp_after - temp_before == set()
    if uploads >= 100:
        assert growth <= GROWTH_LIMIT_MB
    for folder in (ROOT, server_tmp):  # no copy of any upload anywhere on disk
        for path in written_since(folder, since):
            assert not holds(path, token.encode()), f"an upload was written to {path}"
