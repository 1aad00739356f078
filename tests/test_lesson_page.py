"""The lesson page runs in both languages and shows the worked example's numbers."""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from attnviz import i18n

from conftest import APP
from test_views_charts import undescribed_guides, untitled_tooltips



def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "latex", "caption", "success", "info") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def open_page(lang: str) -> AppTest:
    # The language is chosen before the first run: AppTest cannot switch a radio whose labels were
    # translated in an earlier run.
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = lang
    at.switch_page("screens/lesson.py").run()
    return at


@pytest.fixture(scope="module")
def pages() -> dict[str, AppTest]:
    return {lang: open_page(lang) for lang in i18n.LANGUAGES}


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_page_runs_and_shows_worked_example(pages: dict[str, AppTest], lang: str):
    page = pages[lang]
    assert page.selectbox(key="lang").value == lang
    assert not page.exception, [e.value for e in page.exception]
    assert not page.error, [e.value for e in page.error]
    assert page.title[0].value == i18n.text(lang, "lesson.title")
    shown = texts(page)
    # Step 2 with its default inputs: scores 1, 0, 1 → 0.707, 0, 0.707 → e: 2.03, 1, 2.03 (Σ 5.06) → 0.40, 0.20, 0.40.
    assert "| 1 | [1, 0] | [1, 0] | 1.00 | 0.707 | 2.03 | 0.40 |" in shown
    assert "| 2 | [0, 1] | [0, 1] | 0.00 | 0.000 | 1.00 | 0.20 |" in shown
    assert "| Σ | | | | | 5.06 | 1.00 |" in shown
    assert i18n.text(lang, "lesson.hand.output", output="[0.80, 0.60]") in shown
    # Step 3: the two softmax examples.
    assert i18n.text(lang, "lesson.scale.result", scores="[2, 1, 0]", weights="[0.67, 0.24, 0.09]") in shown
    assert i18n.text(lang, "lesson.scale.result", scores="[20, 10, 0]", weights="[0.99995, 0.000045, 0.0000000021]") in shown
    # Every tab title is in the chosen language.
    assert [tab.label for tab in page.tabs] == [i18n.text(lang, f"lesson.tab{i}") for i in range(1, 8)]


def test_editing_an_input_updates_every_number(pages: dict[str, AppTest]):
    page = pages["en"]
    page.number_input(key="ex_q1").set_value(1.0).run()  # q = [1, 1]: scores 1, 1, 2
    assert not page.exception
    shown = texts(page)
    # scaled 0.707, 0.707, 1.414 → e: 2.03, 2.03, 4.11 (Σ 8.17) → weights 0.25, 0.25, 0.50 → o = [0.75, 0.75]
    assert "| 3 | [1, 1] | [1, 1] | 2.00 | 1.414 | 4.11 | 0.50 |" in shown
    assert "| Σ | | | | | 8.17 | 1.00 |" in shown
    assert i18n.text("en", "lesson.hand.output", output="[0.75, 0.75]") in shown
    page.number_input(key="ex_q1").set_value(0.0).run()


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_pair_step_agrees_with_heatmap(pages: dict[str, AppTest], lang: str):
    shown = [s.value for s in pages[lang].success]
    prefix = i18n.text(lang, "lesson.pair.equal", weight="W", cell="C", diff="D", row=0, col=0).split("W")[0]
    assert any(s.startswith(prefix) for s in shown)


def test_perturbation_test_runs_and_says_what_its_chart_shows(pages: dict[str, AppTest], real_model):
    """The sentence under the chart is the chart's own: the areas under the red and grey curves and where they end,
    recomputed here from the same removal test (layer 12, mean of heads, mean colour, up to 50 %, seed 0)."""
    import numpy as np

    import attnviz
    from attnviz import lesson
    from attnviz_app.settings import DEFAULT_PHOTO

    # English only: after a rerun AppTest formats translated radio labels outside the session (always "en").
    page = pages["en"]
    charts_before = len(page.get("vega_lite_chart"))
    page.button(key="perturb_run").click().run()
    assert not page.exception, [e.value for e in page.exception]
    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample(DEFAULT_PHOTO), real_model).image)
    result = lesson.perturbation(real_model, cap, 11, "mean", fill="mean", max_fraction=0.5)
    race = result.race
    x = result.fractions
    assert race.attended_area == pytest.approx(np.trapezoid(result.attended, x), abs=1e-12)
    assert race.random_area == pytest.approx(np.trapezoid(result.random_mean, x), abs=1e-12)
    assert (race.attended_end, race.random_end) == (result.attended[-1], result.random_mean[-1])
    ahead = race.attended_area - race.random_area > race.area_spread
    assert race.story in (("ahead", "mostly_ahead", "caught_up", "overtaken") if ahead else ("same", "behind"))
    if race.random_end > race.attended_end + race.end_spread:  # the grey curve ends above: the sentence says so
        assert race.story in ("overtaken", "behind")
    said = [i.value for i in page.info if i.value == lesson.race_sentence(race, "en")]
    assert said, [i.value for i in page.info]
    assert f"{race.attended_area:.4f}" in said[0] and f"{race.random_end:.4f}" in said[0]
    assert len(page.get("vega_lite_chart")) == charts_before + 1  # the output-change plot
    for chart in page.get("vega_lite_chart"):  # every chart of the lesson: its tooltips say what they show
        assert untitled_tooltips(json.loads(chart.proto.spec)) == [], chart.proto.spec[:300]
        assert undescribed_guides(json.loads(chart.proto.spec)) == set(), chart.proto.spec[:300]


@pytest.mark.browser
def test_language_switch_after_running_the_test_in_a_real_browser(app_in_chromium):
    """Switching language after the perturbation test keeps every choice and raises nothing (a real bug once)."""
    from serve import quiet, settle

    url, browser = app_in_chromium
    page = browser.new_page(viewport={"width": 1400, "height": 2000})
    page.goto(url + "/lesson")
    page.get_by_text(i18n.text("en", "lesson.title")).wait_for(timeout=120_000)
    quiet(page)  # each click below lands on a page whose run is over, not on an element being replaced
    page.get_by_role("tab").nth(6).click()
    quiet(page)
    page.get_by_role("button", name=i18n.text("en", "lesson.explain.run", layer=12)).click()
    page.get_by_text(i18n.text("en", "lesson.explain.change_axis")).first.wait_for(timeout=120_000)
    quiet(page)
    page.locator("[data-testid=stSidebar] [data-testid=stSelectbox]").first.click()
    page.get_by_role("option", name="繁體中文").click()
    page.get_by_text(i18n.text("zh-TW", "lesson.title")).wait_for(timeout=60_000)
    settle(page)
    quiet(page)
    # the page stays on step 7 in its new language (the step is remembered as a number, not a label)
    assert page.get_by_role("tab", selected=True).inner_text() == i18n.text("zh-TW", "lesson.tab7")
    quiet(page)
    page.get_by_role("button", name=i18n.text("zh-TW", "lesson.explain.run", layer=12)).click()
    page.get_by_text(i18n.text("zh-TW", "lesson.explain.change_axis")).first.wait_for(timeout=120_000)
    assert page.locator("[data-testid=stException]").count() == 0
    assert page.locator("[data-testid=stAlertContentError]").count() == 0
    # The choices kept their value under their Chinese labels.
    rank_by = page.get_by_role("combobox", name=i18n.text("zh-TW", "lesson.explain.rank_by"))
    assert rank_by.input_value() == i18n.text("zh-TW", "lesson.explain.mean_heads")
    checked = page.locator("[data-testid=stRadio] input[type=radio]:checked")
    assert checked.count() >= 3  # photo source, fit, removal fill
    page.close()


def test_the_lessons_presenter_view_has_a_join_box_that_opens_the_lesson(monkeypatch):
    """``/lesson?present=1``: no title, a Leave button, and a join box whose QR code opens the lesson (not Explore) on
    the photo and language shown; the address holds the same choices; leaving brings the title back."""
    from attnviz_app import classroom

    encoded = []
    real = classroom.qr_png
    monkeypatch.setattr(classroom, "qr_png", lambda url: encoded.append(url) or real(url))
    monkeypatch.setenv("ATTNVIZ_JOIN_URL", "http://attnviz.school")
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"present": "1", "photo": "rocket", "lang": "en"})
    at.switch_page("screens/lesson.py").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert not at.title and at.toggle(key="present").value
    assert any("`http://attnviz.school/lesson`" in m.value for m in at.markdown)
    assert encoded[-1] == "http://attnviz.school/lesson?layer=12&head=1&step=1&photo=rocket&lang=en"
    assert at.query_params == {"present": "1", "layer": "12", "head": "1", "step": "1", "photo": "rocket", "lang": "en"}
    assert at.selectbox(key="sample").value == "rocket"
    at.button(key="step_next").click().run()  # the presenter's → (a remote clicker's) walks the steps
    at.button(key="step_next").click().run()
    assert at.session_state["lesson_step.en"] == i18n.text("en", "lesson.tab3") and at.query_params["step"] == "3"
    assert encoded[-1] == "http://attnviz.school/lesson?layer=12&head=1&step=3&photo=rocket&lang=en"
    for _ in range(3):
        at.button(key="step_prev").click().run()
    assert at.session_state["lesson_step.en"] == i18n.text("en", "lesson.tab1")  # none before the first
    at.button(key="leave_present").click().run()
    assert [t.value for t in at.title] == [i18n.text("en", "lesson.title")] and "present" not in at.query_params
    assert not any("attnviz.school" in m.value for m in at.markdown)  # no join box on the ordinary page


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_a_link_opens_the_lessons_step_layer_and_head(lang):
    """``/lesson?step=4&layer=5&head=3``: the fourth step's tab, layer 5 and head 3 (whose numbers the step shows)."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"step": "4", "layer": "5", "head": "3", "lang": lang})
    at.switch_page("screens/lesson.py").run()
    assert not at.exception and not at.error and not at.warning, [e.value for e in [*at.exception, *at.error, *at.warning]]
    assert at.session_state[f"lesson_step.{lang}"] == i18n.text(lang, "lesson.tab4")
    assert at.slider(key="lesson_layer").value == 5 and at.selectbox(key=f"lesson_head.{lang}").value == 2
    assert at.query_params == {"layer": "5", "head": "3", "step": "4", "photo": "coffee", "lang": lang}


def test_a_lesson_link_with_values_it_does_not_offer_opens_its_first_step():
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"step": "9", "layer": "40", "head": "99", "lang": "en"})
    at.switch_page("screens/lesson.py").run()
    assert not at.exception and not at.error and not at.warning, [e.value for e in [*at.exception, *at.error, *at.warning]]
    assert at.session_state["lesson_step.en"] == i18n.text("en", "lesson.tab1")
    assert at.slider(key="lesson_layer").value == 12 and at.selectbox(key="lesson_head.en").value == 0
    assert at.query_params == {"layer": "12", "head": "1", "step": "1", "photo": "coffee", "lang": "en"}


def test_a_lesson_link_opens_the_pair_and_the_scaling_the_teacher_set():
    """/lesson?step=4&query=r3c5&key=r9c2&dk=16&divisor=4: the query-key pair on the projector, not the middle of the
    grid, and the scaling step's d_k and divisor; the address follows the sliders."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"step": "4", "query": "r3c5", "key": "r9c2", "dk": "16", "divisor": "4", "lang": "en"})
    at.switch_page("screens/lesson.py").run()
    assert not at.exception and not at.error and not at.warning, [e.value for e in [*at.exception, *at.error, *at.warning]]
    assert (at.slider(key="pair_q_row").value, at.slider(key="pair_q_col").value) == (3, 5)
    assert (at.slider(key="pair_k_row").value, at.slider(key="pair_k_col").value) == (9, 2)
    assert at.slider(key="scale_divisor").value == 4.0 and at.select_slider(key="scale_dk").value == 16
    # the pair step's numbers are this pair's: query token 1 + 2·14 + 4, key token 1 + 8·14 + 1
    assert i18n.text("en", "lesson.pair.tokens", q=33, k=114, layer=12, head=1) in texts(at)
    assert i18n.text("en", "lesson.scale.conclusion", dk=16, root=4.0) in texts(at)
    assert at.query_params == {"layer": "12", "head": "1", "query": "r3c5", "key": "r9c2", "dk": "16", "divisor": "4",
                               "step": "4", "photo": "coffee", "lang": "en"}
    at.slider(key="pair_k_row").set_value(8).run()
    at.select_slider(key="scale_dk").set_value(64).run()  # back at the first: the address leaves it out
    assert at.query_params["key"] == "r8c2" and "dk" not in at.query_params


def test_a_lesson_link_opens_the_last_steps_ranking_fill_and_share_removed():
    """/lesson?step=7&rank=3&remove=blur&upto=90: head 3 ranks the patches, blurred away, up to 90% (the button
    still runs it: nothing heavy on opening); the address follows the boxes."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"step": "7", "rank": "3", "remove": "blur", "upto": "90", "lang": "en"})
    at.switch_page("screens/lesson.py").run()
    assert not at.exception and not at.error and not at.warning, [e.value for e in [*at.exception, *at.error, *at.warning]]
    assert at.selectbox(key="perturb_head.en").value == 2 and at.radio(key="perturb_fill.en").value == "blur"
    assert at.slider(key="perturb_max").value == 90
    assert at.query_params == {"layer": "12", "head": "1", "rank": "3", "remove": "blur", "upto": "90", "step": "7",
                               "photo": "coffee", "lang": "en"}
    at.selectbox(key="perturb_head.en").set_value("mean").run()
    at.slider(key="perturb_max").set_value(30).run()
    assert "rank" not in at.query_params and at.query_params["upto"] == "30" and at.query_params["remove"] == "blur"


@pytest.mark.parametrize("params", [
    {"query": "r20c3", "key": "r0c1", "dk": "3", "divisor": "50", "rank": "13", "remove": "token", "upto": "95"},
    {"query": "r3", "key": "r8c8; drop", "dk": "", "divisor": "nan", "rank": "0", "remove": "", "upto": "55"},
])  # the 14 x 14 grid has no row 20, the model no head 13, the lesson no token removal
def test_a_lesson_link_s_pair_and_scaling_the_page_does_not_offer_are_left_out(params):
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"step": "4", "lang": "en", **params})
    at.switch_page("screens/lesson.py").run()
    assert not at.exception and not at.error and not at.warning, [e.value for e in [*at.exception, *at.error, *at.warning]]
    assert (at.slider(key="pair_k_row").value, at.slider(key="pair_k_col").value) == (8, 8)
    assert at.slider(key="scale_divisor").value == 1.0 and at.select_slider(key="scale_dk").value == 64
    assert at.selectbox(key="perturb_head.en").value == "mean" and at.radio(key="perturb_fill.en").value == "mean"
    assert at.slider(key="perturb_max").value == 50
    assert at.query_params == {"layer": "12", "head": "1", "step": "4", "photo": "coffee", "lang": "en"}
