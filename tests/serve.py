"""Start the real Streamlit server and a real headless Chromium (Debian's), for browser tests and bench/."""
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
    port: int | None = None, env: dict | None = None, timeout: float = 120, launcher: list[str] | None = None
):
    """Run ``streamlit run app.py`` (a checkout's way) on 127.0.0.1; yield (url, process).

    ``launcher`` replaces ``python -m streamlit run app.py``, e.g. ``ATTNVIZ_APP`` (``attnviz app``, the
    installed way); it is given the server options.
    """
    port = port or free_port()
    log = open(os.devnull, "w")
    launcher = launcher or [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py")]
    proc = subprocess.Popen(
        [*launcher, "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true"],
        cwd=ROOT, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
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
                raise RuntimeError("the Streamlit server did not start")
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
    again (by click, then by keyboard) up to three times before the option is clicked."""
    for _ in range(3):
        page.locator(box).first.click()
        if not option.count():
            page.keyboard.press("ArrowDown")  # a click that focused the box without opening its list
        try:
            option.wait_for(timeout=5_000)
            break
        except Exception:
            page.keyboard.press("Escape")
    option.click()
