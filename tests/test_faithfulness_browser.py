"""Issue #20's views on the real page in headless Chromium, with the offline model on the sample photo.

A head switched off by a click on the effect grid redraws the map and the output sentence with this
capture's numbers; a click on the neuron view's picture picks the query patch, and the weight shown is
``cap.weights``'s; the faithfulness run shows a progress bar and stops on Cancel. With ``--slow`` the
whole faithfulness panel runs (about a minute on the shared 2-core machine) and, with
``ATTNVIZ_SHOTS=folder``, screenshots are taken at desktop, projector and phone sizes.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import attnviz
from attnviz import ablation, faithfulness as fa

from serve import MEASURE, SCREENS, choose_view, open_page, pick, settle, shot

LABELS = {"faithfulness": "Does attention explain? All maps tested", "ablation": "Switch heads off (causal test)",
          "neuron": "One weight, from q and k (neuron view)"}
@pytest.fixture(scope="module")
def page_capture(real_model):
    """The capture of the page's first photo (settings.DEFAULT_PHOTO), as the page decodes it."""
    from attnviz_app.settings import DEFAULT_PHOTO

    return attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample(DEFAULT_PHOTO), real_model).image)


def open_view(page, url: str, key: str) -> None:
    page.goto(url)
    page.locator("[data-testid='stImage'] img").first.wait_for(timeout=180_000)  # the first heatmap: model ready
    settle(page)
    choose_view(page, LABELS[key])


def click_in(page, selector: str, fx: float, fy: float) -> None:
    """Click at fractions (fx, fy) of the drawn marks of the chart inside ``selector``."""
    marks = page.locator(f"{selector} .marks").first
    marks.wait_for(timeout=60_000)
    box = marks.bounding_box()
    page.mouse.click(box["x"] + fx * box["width"], box["y"] + fy * box["height"])


@pytest.mark.browser
def test_click_a_head_off_and_pick_a_query_patch(app_in_chromium, real_model, page_capture):
    url, browser = app_in_chromium
    page = open_page(browser, "desktop")
    open_view(page, url, "ablation")
    page.locator(".st-key-ablation_run button").click()
    page.get_by_text("rank correlation (Spearman)").wait_for(timeout=180_000)
    settle(page)
    grid = ablation.head_ablation(real_model, page_capture)
    text = page.locator("[data-testid='stAlertContentInfo']").first.inner_text()
    assert f"{grid.entropy_correlation:+.2f} over the 72 heads" in text
    follows = {"little": "says little", "more": "focused heads (low entropy) tend to matter more",
               "less": "focused heads (low entropy) tend to matter less"}[grid.tendency("entropy")]
    assert follows in text, text  # the sentence that follows from ρ on this photo
    page.locator(".st-key-ablation_grid_0").scroll_into_view_if_needed()
    shot(page, "ablation_desktop_en_grid")
    click_in(page, ".st-key-ablation_grid_0", 0.55, 0.45)  # one cell of the effect grid
    page.get_by_text(re.compile(r"Without 1 head")).wait_for(timeout=60_000)
    settle(page)
    page.locator("[data-testid='stMultiSelect']").first.scroll_into_view_if_needed()
    shot(page, "ablation_desktop_en_off")
    chosen = page.locator("[data-testid='stMultiSelect']").first.inner_text()
    layer, head = (int(n) for n in re.search(r"layer (\d+), head (\d+)", chosen).groups())
    ablated = ablation.ablated_capture(real_model, page_capture, [(layer - 1, head - 1)])
    out, base = ablated.output.double(), page_capture.output.double()
    cos = float(out @ base / (out.norm() * base.norm()))
    said = " ".join(page.locator("[data-testid='stAlertContentInfo']").all_inner_texts())
    assert f"cosine similarity {cos:.4f}" in said, said

    open_view(page, url, "neuron")
    click_in(page, ".st-key-neuron_query_chart", 0.1, 0.1)  # the top-left patch
    page.get_by_text("Query patch (row 2, column 2)").or_(page.get_by_text("Query patch (row 1, column 1)")) \
        .first.wait_for(timeout=60_000)
    settle(page)
    title = page.get_by_text(re.compile(r"Query patch \(row \d+, column \d+\)")).first.inner_text()
    row, col = (int(n) - 1 for n in re.findall(r"\d+", title))
    key_title = page.get_by_text(re.compile(r"Key patch \(row \d+, column \d+\)")).first.inner_text()
    krow, kcol = (int(n) - 1 for n in re.findall(r"\d+", key_title))
    layer = 11  # the page's default layer: the last
    weight = float(page_capture.weights(layer, 0)[1 + row * 14 + col, 1 + krow * 14 + kcol])
    assert f"{weight:.6f}" in " ".join(page.locator("[data-testid='stMarkdown']").all_inner_texts())
    shot(page, "neuron_desktop_en")
    # "Show data" opens the numbers a picture shows (where the query looks); the query picker draws only the photo
    for chart, offered in (("neuron_key_chart", True), ("neuron_query_chart", False)):
        page.locator(f".st-key-{chart} .marks").first.hover()
        page.wait_for_timeout(300)
        assert page.locator(f".st-key-{chart} [data-testid='stElementToolbar'] button").first.is_visible() == offered
    page.locator(".st-key-neuron_key_chart .marks").first.hover()
    page.locator(".st-key-neuron_key_chart [data-testid='stElementToolbar'] button").first.click()
    page.locator(".st-key-neuron_key_chart [data-testid='stDataFrame']").wait_for(timeout=30_000)
    page.locator("[data-testid='stVegaLiteChart']").last.scroll_into_view_if_needed()
    shot(page, "neuron_desktop_en_strip")


@pytest.mark.browser
def test_faithfulness_shows_progress_and_cancels(app_in_chromium):
    url, browser = app_in_chromium
    page = open_page(browser, "projector")
    open_view(page, url, "faithfulness")
    page.locator(".st-key-faith_fill").get_by_text("blur fill").click()  # a setting no other test measures
    settle(page)
    page.locator(".st-key-faith_run button").click()
    page.locator("[data-testid='stProgress']").first.wait_for(timeout=60_000)
    page.locator(".st-key-faith_cancel button").click()
    page.get_by_text("Cancelled: nothing was measured.").wait_for(timeout=60_000)
    assert page.locator("[data-testid='stVegaLiteChart']").count() == 0


@pytest.mark.slow
@pytest.mark.browser
def test_faithfulness_panel_at_three_sizes(app_in_chromium, real_model, page_capture):
    url, browser = app_in_chromium
    result = fa.faithfulness(real_model, page_capture, fill="token")
    for name, size in SCREENS.items():
        page = open_page(browser, name)
        open_view(page, url, "faithfulness")
        page.locator(".st-key-faith_run button").click()  # the first size runs it; the others read the shared result
        page.locator("[data-testid='stVegaLiteChart']").first.wait_for(timeout=300_000)
        settle(page)
        said = page.locator("[data-testid='stAlertContentInfo']").first.inner_text()
        assert said == fa.sentence(result), said
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= size["viewport"]["width"], (name, width)
        assert not page.evaluate(MEASURE)["clipped"], name  # no chart cut off at the right of its box
        shot(page, f"faithfulness_{name}_en")
        page.locator("[data-testid='stVegaLiteChart']").first.scroll_into_view_if_needed()
        shot(page, f"faithfulness_{name}_en_chart")
        page.locator("[data-testid='stDataFrame']").first.scroll_into_view_if_needed()
        shot(page, f"faithfulness_{name}_en_table")
        if name == "desktop":  # the same result, read in Chinese
            pick(page, "lang", "繁體中文", exact=True)
            page.get_by_text("在這張照片上").first.wait_for(timeout=120_000)
            settle(page)
            assert page.locator("[data-testid='stAlertContentInfo']").first.inner_text() == fa.sentence(result, "zh-TW")
            page.locator("[data-testid='stVegaLiteChart']").first.scroll_into_view_if_needed()
            shot(page, "faithfulness_desktop_zh_chart")
        page.close()
    # The lesson's last step shows the same measurement of this photo (one shared job: no second run).
    page = open_page(browser, "desktop")
    open_view(page, url, "faithfulness")
    page.get_by_role("link", name="Lesson: how attention works").click()
    page.get_by_role("tab").first.wait_for(timeout=120_000)
    page.get_by_role("tab", name="7 · Is attention an explanation?").click()
    page.get_by_text("Every map, tested the same way").wait_for(timeout=120_000)
    page.get_by_text(fa.sentence(result)).wait_for(timeout=120_000)
    settle(page)
    page.get_by_text("Every map, tested the same way").scroll_into_view_if_needed()
    shot(page, "lesson_step7_desktop_en")
    page.close()
    for key in ("ablation", "neuron"):  # the phone: the grid (measured by the test above) and the neuron view
        page = open_page(browser, "phone")
        open_view(page, url, key)
        if key == "ablation":
            if page.locator(".st-key-ablation_run button").count():  # not measured on this server yet
                page.locator(".st-key-ablation_run button").click()
            page.get_by_text("rank correlation (Spearman)").wait_for(timeout=180_000)
            settle(page)
        page.locator("[data-testid='stVegaLiteChart']").first.scroll_into_view_if_needed()
        shot(page, f"{key}_phone_en")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 390, (key, width)
        assert not page.evaluate(MEASURE)["clipped"], key
        page.close()
    assert np.isfinite([c.deletion_area for c in result.curves]).all()
