"""The token-norms view and the class-token view's high-norm notes say what the capture shows, and
a model without a class token is labelled as such on the page."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.capture import HIGH_NORM_RATIO, capture_tensor
from attnviz_app.settings import DEFAULT_PHOTO
from conftest import APP


def test_token_norms_are_the_block_outputs(tiny):
    x = torch.randn(1, 3, 32, 32)
    outputs = []
    hooks = [b.register_forward_hook(lambda _m, _i, o: outputs.append(o[0].norm(dim=-1))) for b in tiny.network.blocks]
    with torch.no_grad():
        tiny.network(x)
    for h in hooks:
        h.remove()
    cap = capture_tensor(tiny, x)
    assert torch.stack(cap.token_norms).shape == (2, 17)  # (N,) after each layer
    for layer in range(2):
        torch.testing.assert_close(cap.token_norms[layer], outputs[layer])
        patches = outputs[layer][1:].double()
        np.testing.assert_allclose(cap.norm_ratio(layer), (patches / patches.median()).reshape(4, 4).numpy())


def test_high_norm_marks_a_planted_outlier(tiny):
    cap = capture_tensor(tiny, torch.randn(1, 3, 32, 32))
    assert cap.high_norm_layers() == []  # a random ViT has none
    norms = [n.clone() for n in cap.token_norms]
    norms[1][1 + 6] = 10 * norms[1][1:].median()  # patch (1, 2) after layer 2
    planted = attnviz.Capture(**{**cap.__dict__, "token_norms": tuple(norms)})
    assert planted.high_norm_layers() == [1]
    expected = np.zeros((4, 4), dtype=bool)
    expected[1, 2] = True
    np.testing.assert_array_equal(planted.high_norm(1), expected)
    assert planted.norm_ratio(1)[1, 2] > HIGH_NORM_RATIO


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_norms_view_and_class_token_reading_on_the_default_model(lang, real_model):
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["lang"] = lang
    at.session_state["view"] = "norms"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample(DEFAULT_PHOTO), real_model).image)  # as the page decodes
    worst = max(range(cap.num_layers), key=lambda i: float(cap.norm_ratio(i).max()))
    layer = at.session_state["layer"] - 1 if "layer" in at.session_state else cap.num_layers - 1
    top = float(cap.norm_ratio(layer).max())
    text = " ".join(m.value for m in at.markdown)
    longest = float(cap.norm_ratio(worst).max())
    if lang == "en":
        assert f"no high-norm patch token (largest {top:.2f}× the median)" in text
        assert f"in this photo the longest patch is {longest:.2f}× its layer's median, after layer {worst + 1}" in text
    else:
        assert f"最大是中位數的 {top:.2f} 倍" in text
        assert f"最長的圖塊是所在層中位數的 {longest:.2f} 倍，在第 {worst + 1} 層之後" in text

    at = AppTest.from_file(str(APP), default_timeout=180).run()  # the class-token view
    assert not at.exception, [e.value for e in at.exception]
    reading = " ".join(m.value for m in at.markdown)
    assert "no patch token's norm exceeds 3× the median in any layer" in reading
    assert f"{float(cap.norm_ratio(worst).max()):.1f}× after layer {worst + 1}" in reading


def no_class_token_page(lang: str) -> None:
    import torch
    from timm.models.vision_transformer import VisionTransformer
    from PIL import Image
    import streamlit as st

    import attnviz
    from attnviz_app import views
    from attnviz_app.text import t  # noqa: F401  (the page's translation function reads the session language)

    st.session_state.setdefault("lang", lang)
    torch.manual_seed(0)
    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                class_token=False, global_pool="avg", num_classes=0)
    model = attnviz.wrap(network, "no-cls", "random init", 32)
    view = Image.new("RGB", (32, 32), "gray")
    cap = attnviz.capture(model, view)
    for name in ("cls", "rollout", "mask", "heads", "norms"):
        views.registered()[name].show(views.Context(model, cap, view, 1, "mean", 0.6, "inferno", False, "crop"))


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_a_model_without_a_class_token_is_labelled_on_the_page(lang):
    at = AppTest.from_function(no_class_token_page, args=(lang,), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    notes = [i.value for i in at.info]
    assert len(notes) >= 4  # cls, rollout, mask, heads each say it
    if lang == "en":
        assert notes[0].startswith("This model has no class token, so there is no class-token row to show.")
        assert any(s.value.startswith("Layer 2, mean of all heads: mean attention each patch receives") for s in at.subheader)
    else:
        assert notes[0].startswith("這個模型沒有類別 token")
