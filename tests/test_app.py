"""The page through Streamlit's AppTest: samples, Layer and Head re-draw, no exception, no model re-run."""
from __future__ import annotations

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from conftest import APP, ASSETS


@pytest.fixture
def app():
    return AppTest.from_file(str(APP), default_timeout=180).run()


def heatmap_url(at) -> str:
    return at.get("image")[0].proto.imgs[0].url


def test_first_view_shows_the_heatmap_and_the_facts(app):
    assert not app.exception and not app.error
    assert [s.label for s in app.slider if s.key == "layer"] == ["Layer"]
    assert app.selectbox(key="head").label == "Head"
    assert app.slider(key="layer").value == 12 and app.selectbox(key="head").value == "mean"
    # the photo and layer measured to land most on their object (python -m bench.defaults, docs/classroom.md)
    assert app.selectbox(key="sample").value == "coffee" and app.radio(key="source").value == "sample"
    facts = next(m.value for m in app.markdown if "**Tokens:**" in m.value)
    assert "**14 × 14**" in facts and "**197**" in facts and "d_k = 64" in facts
    assert any("no class predictions" in i.value for i in app.info)


def test_layer_and_head_change_the_picture_to_the_librarys_map_of_that_layer_and_head(app, real_model, monkeypatch):
    import attnviz
    from attnviz import render

    drawn = []  # the (h, w) maps the page lays over the photo
    original = render.overlay
    monkeypatch.setattr(render, "overlay", lambda view, grid_map, **kw: drawn.append(grid_map) or original(
        view, grid_map, **kw))
    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample("coffee"), real_model).image)
    shown = {"first": heatmap_url(app)}  # layer 12, mean of all heads
    for step, (layer, head) in {"layer": (3, "mean"), "head": (3, 2), "layer again": (12, 2)}.items():
        drawn.clear()
        app.slider(key="layer").set_value(layer)
        app.selectbox(key="head").set_value(head)
        app.run()
        assert not app.exception
        expected = cap.summary_map(layer - 1, head if head == "mean" else head - 1)
        assert drawn and np.allclose(drawn[0], expected, atol=1e-6), (step, layer, head)
        shown[step] = heatmap_url(app)
    assert len(set(shown.values())) == 4  # and the browser is sent a new picture each time
    assert app.subheader[0].value == "Layer 12, head 2: where the class token looks"


def test_changing_the_view_does_not_run_the_model_again(app, monkeypatch):
    import attnviz

    calls = []
    original = attnviz.capture
    monkeypatch.setattr(attnviz, "capture", lambda *a, **k: calls.append(1) or original(*a, **k))
    assert app.subheader[0].value == "Layer 12, mean of all heads: where the class token looks"
    app.slider(key="layer").set_value(5).run()
    app.selectbox(key="head").set_value("max").run()
    app.slider(key="alpha").set_value(0.3).run()
    app.selectbox(key="view").set_value("matrix").run()
    assert not app.exception and app.selectbox(key="view").value == "matrix"
    assert app.subheader[0].value.startswith("Layer 5, ") and "the full 197 × 197 attention matrix" in \
        app.subheader[0].value  # the view changed, keeping the layer
    app.selectbox(key="view").set_value("cls").run()
    assert app.subheader[0].value.startswith("Layer 5, ") and "where the class token looks" in app.subheader[0].value
    assert calls == [] and not app.exception  # one capture served every view


def test_another_sample_and_chinese(app):
    app.selectbox(key="sample").set_value("rocket").run()
    assert not app.exception and heatmap_url(app)
    text = " ".join(m.value for m in app.markdown)
    assert "so a patch at 0.0051 gets exactly an equal share" in text  # 1 / 197 tokens
    assert "Vision Transformers Need Registers" in text  # the default model has no register tokens
    app.selectbox(key="lang").set_value("zh-TW").run()
    assert not app.exception
    assert app.title[0].value == "視覺 Transformer 在看哪裡？"
    assert app.slider(key="layer").label == "層"
    text = " ".join(m.value for m in app.markdown)
    assert "DINOv2 風格的 ViT-S/14 骨幹網路" in text and "backbone" not in text
    assert "所以 0.0051 正好是平均分配的一份（" in text


def test_file_names_are_not_read_as_markdown_and_messages_are_translated(app):
    app.radio(key="source").set_value("upload").run()
    app.file_uploader(key="upload").set_value(("**x**[a](b).png", b"plain text", "image/png")).run()
    assert [e.value for e in app.error] == [
        r"\*\*x\*\*\[a\]\(b\).png is not an image this app can read (use JPEG, PNG, HEIC, AVIF, WebP, GIF, BMP or TIFF)."
    ]
    app.selectbox(key="lang").set_value("zh-TW").run()
    assert app.error[0].value.endswith("不是這個程式能讀取的圖片（請使用 JPEG、PNG、HEIC、AVIF、WebP、GIF、BMP 或 TIFF）。")
    assert not app.exception


def test_layer_and_head_survive_a_run_that_stopped_early(app):
    """A new upload first reruns with no file (the page stops early); Layer and Head must be kept.

    AppTest keeps widget state on its own; tests/test_browser.py checks the same in a real browser,
    where the bug showed.
    """
    app.slider(key="layer").set_value(5).run()
    app.selectbox(key="head").set_value(3).run()
    app.radio(key="source").set_value("upload").run()  # no file yet: the page stops before the widgets
    assert any(i.value == "Choose a sample, upload a photo or take one with the camera." for i in app.info)
    app.file_uploader(key="upload").set_value(("cat.jpg", (ASSETS / "cat.jpg").read_bytes(), "image/jpeg"))
    app.run()
    assert app.slider(key="layer").value == 5 and app.selectbox(key="head").value == 3
    assert app.subheader[0].value == "Layer 5, head 3: where the class token looks"


def test_kept_choices_log_no_session_state_warning(monkeypatch):
    """Each run re-assigns the kept choices through session state (ui.keep_choices); a kept widget drawn with a
    value of its own as well made Streamlit log, once per process, a warning with a whole stack trace."""
    from streamlit.elements.lib import policies

    logged: list[str] = []
    monkeypatch.setattr(policies, "_shown_default_value_warning", False)  # once per process: as if first
    monkeypatch.setattr(policies._LOGGER, "warning", lambda message, *args, **_: logged.append(message % args))
    at = AppTest.from_file(str(APP), default_timeout=180).run()
    at.slider(key="layer").set_value(5).run()
    shown = at.selectbox(key="sample")
    at.selectbox(key="sample").set_value(next(o for o in shown.options if o != shown.value)).run()
    assert not at.exception
    assert at.slider(key="layer").value == 5 and at.slider(key="alpha").value == 0.6  # kept, and the first value
    assert at.toggle(key="smooth").value is False
    assert [m for m in logged if "default value" in m] == []


def test_how_to_read_says_what_this_capture_does_in_depth(app, real_model, cat):
    """The tip under the heatmap is measured on the photo shown (the cup of coffee), recomputed here with numpy from
    the timm capture's weights: this model's class token is most spread out in a late layer (the tip used to say
    that later layers gather on the object), and layer 12's map of the mean of heads is concentrated: its
    brightest 20 of 196 patches hold 42 % of its weight (diffuse below 25 %)."""
    import math

    import numpy as np

    import attnviz

    cap = attnviz.capture(real_model, attnviz.load_photo(ASSETS / "coffee.jpg", real_model).image)
    rows = [np.asarray(cap.weights(layer, h)[0], dtype=np.float64) for layer in range(12) for h in range(6)]
    rows = np.array(rows).reshape(12, 6, -1)  # (L, H, N): the class token's rows
    def nats(p):
        return -(p * np.log(p)).sum(-1)
    mean_map = nats(rows.mean(1))
    focused, spread = int(mean_map.argmin()), int(mean_map.argmax())
    assert spread >= 6 > focused  # this model on the cup: concentrated early, spread late
    heads = nats(rows[11])
    tip = next(m.value for m in app.markdown if "most concentrated in layer" in m.value)
    assert (f"most concentrated in layer {focused + 1} and most spread out in layer {spread + 1}: its entropy "
            f"there is {mean_map[focused]:.2f} and {mean_map[spread]:.2f} nats") in tip, tip
    assert f"ln 197 = {math.log(197):.2f}" in tip
    assert f"in layer 12 their entropies range from {heads.min():.2f} to {heads.max():.2f} nats" in tip, tip
    patches = rows[11].mean(0)[1:]  # the map shown: the mean of heads over the 196 patches
    top = np.sort(patches)[::-1][:20].sum() / patches.sum()
    assert 0.25 < top < 0.5  # measured 0.424: concentrated
    assert (f"This map is concentrated: its brightest 20 of 196 patches hold {top:.1%} of its weight, where an even "
            f"spread would give 10.2% (below 25% this page calls a map diffuse).") in tip, tip


def test_where_there_is_a_gpu_the_device_box_offers_it_first(monkeypatch):
    """As ``load_model`` does, the page puts the model on the GPU unless the visitor picks the CPU."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # this machine has none: only the box is looked at
    at = AppTest.from_file(str(APP), default_timeout=180).run()
    box = at.selectbox(key="device")
    assert box.options == ["GPU (cuda)", "CPU"] and box.value == "cuda"  # what a student reads, what the page uses
