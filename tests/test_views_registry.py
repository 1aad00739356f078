"""A view is one module that registers itself: the page finds it, labels it, and gives it only the
controls it declares (a view that declares nothing gets none)."""
from __future__ import annotations

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from attnviz import i18n
from attnviz_app import views
from attnviz_app.views import base

from conftest import APP


def toy_show(ctx: views.Context) -> None:
    """Draws one number that depends on the Layer the page passed: the class token's largest weight."""
    st.text(f"toy view: layer {ctx.layer + 1}, max cls weight {ctx.cap.weights(ctx.layer, 'mean')[0, 1:].max():.6f}")


def bare_show(ctx: views.Context) -> None:
    st.text("bare view")


@pytest.fixture
def toy_views(monkeypatch):
    """Two views registered as a new module would register them, removed again after the test."""
    views.registered()  # the built-in views register first, into the real registry
    monkeypatch.setattr(base, "_REGISTERED", dict(base._REGISTERED))
    views.register(views.View("toy", toy_show, controls=frozenset({views.LAYER}), order=15))
    views.register(views.View("bare", bare_show, order=16))
    for lang in i18n.LANGUAGES:  # the label a new view adds to each catalogue
        monkeypatch.setitem(i18n.catalogue(lang), "views.toy", "Toy" if lang == "en" else "玩具")
        monkeypatch.setitem(i18n.catalogue(lang), "views.bare", "Bare" if lang == "en" else "空白")


def test_every_view_module_is_found_in_order():
    """Every module of the views package that registers a view is in the View box, in its own order; the list is
    the package's, not one kept by hand here."""
    import pkgutil
    from pathlib import Path

    folder = Path(views.__file__).parent
    registering = {m.name for m in pkgutil.iter_modules([str(folder)])
                   if "\nregister(View(" in (folder / f"{m.name}.py").read_text(encoding="utf-8")}
    found = views.registered()
    assert set(found) == registering and len(found) >= 14
    assert all(view.show.__module__ == f"attnviz_app.views.{name}" for name, view in found.items())
    orders = [(view.order, name) for name, view in found.items()]
    assert orders == sorted(orders) and list(found)[:2] == ["cls", "query"]  # the class token's map first


def test_a_registered_view_appears_on_the_page_with_only_its_controls(toy_views):
    at = AppTest.from_file(str(APP), default_timeout=180).run()
    assert at.selectbox(key="view").options[:3] == ["Class token → patches", "Toy", "Bare"]
    at.selectbox(key="view").set_value("toy").run()
    at.run()  # the controls follow the view chosen in the run before
    assert not at.exception, [e.value for e in at.exception]
    assert "layer" in {s.key for s in at.slider} and "head" not in {s.key for s in at.selectbox}
    assert all(_display(at, key).disabled for key in ("alpha", "cmap", "smooth"))
    at.slider(key="layer").set_value(3).run()
    text = [t.value for t in at.text if t.value.startswith("toy view")]
    assert len(text) == 1 and text[0].startswith("toy view: layer 3, max cls weight ")
    assert 1 / 197 < float(text[0].rsplit(" ", 1)[1]) < 1  # a real weight of the 197-token capture

    at.selectbox(key="view").set_value("bare").run()
    at.run()
    assert [t.value for t in at.text if t.value == "bare view"] == ["bare view"]
    assert "layer" not in {s.key for s in at.slider} and "head" not in {s.key for s in at.selectbox}
    assert all(_display(at, key).disabled for key in ("alpha", "cmap", "smooth"))


def _display(at: AppTest, key: str):
    return {"alpha": at.slider, "cmap": at.selectbox, "smooth": at.toggle}[key](key=key)


def test_two_views_may_not_share_a_name(toy_views):
    with pytest.raises(ValueError, match="two views are called 'toy'"):
        views.register(views.View("toy", bare_show))


def tiny_page(view: str):  # AppTest runs its source alone: it imports what it uses
    import torch
    from PIL import Image

    import attnviz
    from attnviz_app import views
    from conftest import tiny_vit

    model = tiny_vit(seed=5)
    with torch.no_grad():
        for block in model.network.blocks:
            block.attn.qkv.weight[:64] *= 4.0
    picture = Image.new("RGB", (32, 32), (120, 80, 40))
    views.registered()[view].show(views.Context(model, attnviz.capture(model, picture), picture, 1, "mean", 0.6,
                                                "inferno", False, "crop"))


@pytest.mark.parametrize("view", list(views.registered()))
def test_no_box_of_a_view_shows_streamlit_s_english_placeholder_in_chinese(view):
    """Streamlit's own "Choose an option" / "Choose options" stay English whatever the page's language: every
    box that can show its placeholder (a multiselect, a select box with nothing chosen) passes its own from
    the catalogue."""
    at = AppTest.from_function(tiny_page, args=(view,), default_timeout=60)
    at.session_state["lang"] = "zh-TW"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    empty = [*at.multiselect, *(box for box in at.selectbox if box.value is None)]
    chinese = set(i18n.catalogue("zh-TW").values())
    for box in empty:
        assert box.proto.placeholder in chinese, (view, box.label, box.proto.placeholder)
    if view == "ablation":
        assert [box.proto.placeholder for box in at.multiselect] == ["挑選要關掉的注意力頭"]


@pytest.mark.parametrize("view, sentence", [("rollout", "classroom.no_layer_head"),
                                            ("stats", "classroom.no_layer_head_stats"),
                                            ("faithfulness", "classroom.no_layer_head_faithfulness")])
def test_a_view_without_layer_and_head_says_why_in_its_own_words(view, sentence):
    """The page hides Layer and Head for a view that reads neither and says why. It said "this view has its own layer
    and head settings below" for all of them, which the statistics (every layer and head at once) and the
    faithfulness test (every map) do not have: each view's own sentence."""

    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["view"] = view
    at.run()
    assert not at.exception
    assert i18n.text("en", sentence) in [c.value for c in at.caption]
    assert not [s for s in at.slider if s.key == "layer"] and not [b for b in at.selectbox if b.key == "head"]
