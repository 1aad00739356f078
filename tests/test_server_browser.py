"""A real server and real browsers: a visitor who closes the tab gives up its place in the job queue."""
from __future__ import annotations

import re
import time

import pytest

from serve import chromium, require_chromium, streamlit_server

TAB7 = "7 · Is attention an explanation?"


def lesson_tab(browser, url, steps_left: int):
    """A visitor on the lesson's last tab with "remove up to" moved ``steps_left`` × 10 % from 50 %."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(url + "/lesson")
    page.get_by_role("tab", name=TAB7).click(timeout=180_000)
    slider = page.get_by_role("slider").last
    slider.focus()
    for _ in range(abs(steps_left)):
        slider.press("ArrowLeft" if steps_left > 0 else "ArrowRight")
    page.get_by_text(f"{50 - 10 * steps_left}%", exact=True).first.wait_for()
    time.sleep(1.0)  # the slider's rerun
    return context, page


def queue_place(page) -> int:
    message = page.get_by_text("Waiting in line").first
    message.wait_for(timeout=60_000)
    return int(re.search(r"number (\d+) in the queue", message.inner_text()).group(1))


@pytest.mark.slow
@pytest.mark.browser
def test_a_visitor_who_leaves_gives_up_the_place_in_the_queue():
    require_chromium()
    with streamlit_server(env={"ATTNVIZ_HEAVY_JOBS": "1"}) as (url, _), chromium() as browser:
        a, page_a = lesson_tab(browser, url, steps_left=-4)  # 90 %: the longest test, running meanwhile
        b, page_b = lesson_tab(browser, url, steps_left=1)
        c, page_c = lesson_tab(browser, url, steps_left=2)
        page_a.get_by_role("button", name="Run the test").click()
        page_a.get_by_text("Removing patches and running the model").first.wait_for(timeout=60_000)
        page_b.get_by_role("button", name="Run the test").click()
        assert queue_place(page_b) == 1
        b.close()  # the visitor leaves while waiting
        time.sleep(2.0)
        page_c.get_by_role("button", name="Run the test").click()
        assert queue_place(page_c) == 1  # b's job is gone: c is next, not second
        page_c.get_by_text(re.compile(r"With \d+% removed")).first.wait_for(timeout=300_000)
        page_a.get_by_text(re.compile(r"With \d+% removed")).first.wait_for(timeout=300_000)
        a.close()
        c.close()
