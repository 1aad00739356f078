"""The three views of issue #20 drawn through AppTest on the tiny ViT: their words are this capture's numbers."""
from __future__ import annotations

import re

import pytest
from streamlit.testing.v1 import AppTest


def page(view: str):
    import torch
    from PIL import Image

    from attnviz_app import views
    from conftest import tiny_vit

    model = tiny_vit(seed=5)
    with torch.no_grad():
        for block in model.network.blocks:
            block.attn.qkv.weight[:64] *= 4.0
    picture = Image.new("RGB", (32, 32), (120, 80, 40))
    cap = __import__("attnviz").capture(model, picture)
    views.registered()[view].show(views.Context(model, cap, picture, 1, "mean", 0.6, "inferno", False, "crop"))


def app(view: str, lang: str) -> AppTest:
    at = AppTest.from_function(page, args=(view,), default_timeout=60)
    at.session_state["lang"] = lang
    return at


def reference(fill="token"):
    import torch
    from PIL import Image

    import attnviz
    from attnviz import faithfulness as fa
    from conftest import tiny_vit

    model = tiny_vit(seed=5)
    with torch.no_grad():
        for block in model.network.blocks:
            block.attn.qkv.weight[:64] *= 4.0
    cap = attnviz.capture(model, Image.new("RGB", (32, 32), (120, 80, 40)))
    return model, cap, fa.faithfulness(model, cap, fill=fill)


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_faithfulness_panel_shows_the_measured_sentence_and_table(lang):
    from attnviz import faithfulness as fa

    at = app("faithfulness", lang)
    if lang == "en":
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert not at.info  # nothing measured before the button
        _, _, result = reference()  # the tiny classifier: 2 layers, rollout, relevance, token norms, 5 random orders
        said = ("Press the button: each map is tested on 18 altered copies of the photo (9 steps each way), "
                f"{2 + 18 * 10} forward passes of the model for all 10 maps, random orders included.")
        assert said in [c.value for c in at.caption] and result.inputs <= 2 + 18 * 10
        assert len(result.curves) + len(result.random) == 10
        assert at.checkbox(key="faith_heads").help == (  # 2 layers × (mean + 4 heads), rollout, relevance, norms, 5
            "Also rank by the own map of each of the 4 heads in every layer: 18 maps instead of 10, "
            f"{2 + 18 * 18} forward passes of the model (slower).")
        at.button(key="faith_run").click().run()
    else:  # AppTest formats a radio's options in the test's own (English) session on a rerun: one run only
        at.session_state["faith_asked"] = ((), "token", False)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    _, _, result = reference()
    assert at.info[0].value == fa.sentence(result, lang)
    table = at.dataframe[0].value
    best = result.ranked()[0]
    assert table.iloc[0, 1] == fa.map_name(best.ranking, lang)
    assert table.iloc[0, 2] == f"{best.deletion_area:.3f}"
    assert ("token removal" if lang == "en" else "移除 token") in table.columns[2]
    if lang != "en":
        return
    at.session_state["faith_fill"] = "blur"
    at.session_state["faith_asked"] = ((), "blur", False)
    at.run()
    assert not at.exception
    _, _, blurred = reference("blur")
    assert at.info[0].value == fa.sentence(blurred, lang)


def phone_results():
    from attnviz_app.views import faithfulness
    from test_views_faithfulness import reference

    faithfulness.results(reference()[2], narrow=True)


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_on_a_phone_the_faithfulness_table_is_three_wrapping_columns(lang):
    """A phone: a Markdown table (its cells wrap inside the 358 px column, where a data frame's cut its last column
    off) of every map with its two areas under short headings; no data frame."""
    from attnviz import faithfulness as fa

    at = AppTest.from_function(phone_results, default_timeout=60)
    at.session_state["lang"] = lang
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.dataframe
    table = next(m.value for m in at.markdown if m.value.startswith("|"))
    lines = table.splitlines()
    heads = {"en": "| Map | deletion ↓ | insertion ↑ |", "zh-TW": "| 圖 | 刪除 ↓ | 插入 ↑ |"}[lang]
    assert lines[0] == heads and lines[1] == "|---|---|---|"
    _, _, result = reference()
    best, *_ = result.ranked()
    assert lines[2] == f"| {fa.map_name(best.ranking, lang)} | {best.deletion_area:.3f} | {best.insertion_area:.3f} |"
    assert len(lines) == 2 + len(result.curves) + 1  # every map, and the random orders' mean ± spread
    assert re.search(r"\| \d\.\d{3} ± \d\.\d{3} \| \d\.\d{3} ± \d\.\d{3} \|$", lines[-1]), lines[-1]


def test_ablation_view_clicks_and_output_sentence():
    from attnviz import ablation
    at = app("ablation", "en")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.button(key="ablation_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    model, cap, _ = reference()
    grid = ablation.head_ablation(model, cap)
    said = [i.value for i in at.info]
    assert any(f"is {grid.entropy_correlation:+.2f} over the 8 heads" in s for s in said), said
    at.multiselect(key="ablation_off").set_value(["0-1", "1-2"]).run()
    assert not at.exception, [e.value for e in at.exception]
    ablated = ablation.ablated_capture(model, cap, [(0, 1), (1, 2)])
    p1 = float(ablated.output.double().softmax(-1)[int(cap.output.argmax())])
    assert any(f"has probability {p1:.3f}" in i.value for i in at.info), [i.value for i in at.info]
    assert len(at.image) >= 2  # before and after


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_neuron_view_equals_the_capture_weight(lang):
    at = app("neuron", lang)
    at.session_state["neuron_query"] = (1, 2)
    at.session_state["neuron_key"] = (3, 0)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    model, cap, _ = reference()
    query, key = 1 + 1 * 4 + 2, 1 + 3 * 4 + 0
    weight = float(cap.weights(1, 0)[query, key])
    text = " ".join(m.value for m in at.markdown)
    assert f"**{weight:.6f}**" in text
    assert f"{weight:.6f}" in " ".join(c.value for c in at.caption)


def rope_page():
    import timm
    import torch
    from PIL import Image

    import attnviz
    from attnviz_app import views

    torch.manual_seed(0)
    network = timm.create_model("vit_small_patch16_rope_224", pretrained=False, num_classes=3, img_size=32,
                                depth=1, embed_dim=32, num_heads=2).eval()
    model = attnviz.wrap(network, "rope", "random init", 32)
    picture = Image.new("RGB", (32, 32), (120, 80, 40))
    cap = attnviz.capture(model, picture)
    for name in ("faithfulness", "ablation"):
        views.registered()[name].show(views.Context(model, cap, picture, 0, "mean", 0.6, "inferno", False, "crop"))


def test_a_rope_model_gets_the_pixel_fills_and_one_sentence():
    at = AppTest.from_function(rope_page, default_timeout=60)
    at.session_state["faith_fill"] = "token"  # asked for before: not available for this model
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key="faith_fill").options == ["mean-colour fill", "blur fill"]
    said = [c.value for c in at.caption] + [i.value for i in at.info]
    assert sum("token removal is not available" in s for s in said) == 1  # the curves say so once
    assert any(b.key == "ablation_run" for b in at.button)  # its heads are switched off at the output projection


def no_class_token_page():
    import timm
    import torch
    from PIL import Image

    import attnviz
    from attnviz_app import views

    torch.manual_seed(0)
    network = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=0, class_token=False,
        global_pool="avg").eval()
    model = attnviz.wrap(network, "gap", "random init", 32)
    picture = Image.new("RGB", (32, 32), (120, 80, 40))
    cap = attnviz.capture(model, picture)
    views.registered()["ablation"].show(views.Context(model, cap, picture, 1, "mean", 0.6, "inferno", False, "crop"))


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_without_a_class_token_the_ablation_statistics_say_whose_attention_they_describe(lang):
    """A ViT without a class token runs the grid too; its statistics are of the attention the patches receive
    (ablation.head_statistics), and the radio, the grid's caption and its title say so, not "class token"."""
    from attnviz import i18n

    at = AppTest.from_function(no_class_token_page, default_timeout=60)
    at.session_state["lang"] = lang
    at.run()
    at.button(key="ablation_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    received = [i18n.text(lang, "ablation_page.entropy_received"), i18n.text(lang, "ablation_page.share_received")]
    assert at.radio(key="ablation_statistic").options == received
    assert received[0] in [c.value for c in at.caption]
    cls = i18n.text(lang, "ablation_page.entropy")
    assert cls not in [c.value for c in at.caption] + at.radio(key="ablation_statistic").options
