"""The page's classroom behaviour through AppTest: controls a view ignores are hidden or disabled, the
presenter view from the URL, odd photos get a note, file kinds and Streamlit's own prompt are translated."""
from __future__ import annotations


import pytest
from streamlit.testing.v1 import AppTest

from make_corpus import entries

from conftest import APP
CORPUS = {e.name: e.data for e in entries() if e.name in ("one_pixel.png", "strip.png")}
DISPLAY = ("alpha", "cmap", "smooth")


@pytest.fixture(scope="module")
def app():
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert not at.exception
    return at


def shown(at: AppTest) -> dict[str, bool]:
    """Which shared controls the page draws, and whether each display setting is enabled."""
    sliders = {s.key for s in at.slider}
    boxes = {s.key for s in at.selectbox}
    return {"layer": "layer" in sliders, "head": "head" in boxes,
            **{key: not _widget(at, key).disabled for key in DISPLAY}}


def _widget(at: AppTest, key: str):
    return {"alpha": at.slider, "cmap": at.selectbox, "smooth": at.toggle}[key](key=key)


@pytest.mark.parametrize("view, layer_head, display", [
    ("cls", True, True), ("query", True, True), ("heads", True, True),
    ("rollout", False, True), ("relevance", False, True), ("stats", False, False),
])
def test_controls_a_view_ignores_are_hidden_or_disabled(app, view, layer_head, display):
    app.selectbox(key="view").set_value(view).run()
    app.run()  # the controls follow the view chosen in the run before
    got = shown(app)
    assert got["layer"] is layer_head and got["head"] is layer_head
    assert all(got[key] is display for key in DISPLAY), got
    if not display:
        assert _widget(app, "alpha").help == "This view does not use this setting."


def test_mass_masks_read_layer_and_head_but_no_colours(app):
    app.selectbox(key="view").set_value("mask").run()
    app.run()
    got = shown(app)
    assert got["layer"] and got["head"] and not any(got[key] for key in DISPLAY)
    app.radio(key="mask_source").set_value("heads").run()
    app.run()
    assert shown(app)["head"] is False and shown(app)["layer"] is True  # one mask per head: Head not read


def test_matrix_reads_colours_but_not_opacity_or_smoothing(app):
    app.selectbox(key="view").set_value("matrix").run()
    app.run()
    got = shown(app)
    assert got["cmap"] and not got["alpha"] and not got["smooth"] and got["layer"] and got["head"]


def test_head_choices_read_head_n(app):
    app.selectbox(key="view").set_value("cls").run()
    head = app.selectbox(key="head")
    assert head.options[:3] == ["mean of all heads", "max over heads", "min over heads"]
    assert head.options[3:5] == ["head 1", "head 2"]
    assert head.placeholder == "Choose an option"


def test_presenter_view_from_the_url():
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["present"] = "1"
    at.run()
    assert not at.exception and at.toggle(key="present").value is True
    assert not at.title  # the chrome is gone
    assert {b.key for b in at.button} >= {"layer_prev", "layer_next", "head_prev", "head_next", "leave_present"}
    assert any("Join on your phone" in m.value for m in at.markdown)
    at.button(key="layer_prev").click().run()
    assert at.slider(key="layer").value == 11
    at.button(key="head_next").click().run()
    assert at.selectbox(key="head").value == "max"
    at.button(key="leave_present").click().run()
    assert at.toggle(key="present").value is False and at.title


def test_odd_photos_get_a_note_and_file_kinds_are_translated():
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.radio(key="source").set_value("upload").run()
    at.file_uploader(key="upload").set_value(("one_pixel.png", CORPUS["one_pixel.png"], "image/png")).run()
    notes = [i.value for i in at.info]
    assert any("1 × 1 pixels is fewer than the model's 14 × 14 patches" in n for n in notes), notes
    at.file_uploader(key="upload").set_value(("strip.png", CORPUS["strip.png"], "image/png")).run()
    assert any("only the middle 2% of this 60 × 3000 picture" in i.value for i in at.info), [i.value for i in at.info]
    at.file_uploader(key="upload").set_value(("paper.pdf", b"%PDF-1.4 not a picture", "application/pdf")).run()
    at.selectbox(key="lang").set_value("zh-TW").run()
    assert at.error[0].value.startswith("paper.pdf 是 PDF 文件，這個程式無法讀取")
    assert not at.exception
