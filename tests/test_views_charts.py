"""Every chart of the Explore page's views offers "Download SVG" and "Download PDF" (#24): the buttons are on
the page, and the chart they convert (captured as the page hands it over) comes out as a self-contained SVG
and a PDF with its axis titles and data labels as text, in English and in Traditional Chinese."""
from __future__ import annotations

import base64
import io
import re
import xml.etree.ElementTree as ET

import pytest
from streamlit.testing.v1 import AppTest
from conftest import Q, K, SCALE

SVG = "{http://www.w3.org/2000/svg}"
VIEWS = ("stats", "faithfulness", "norms", "ablation", "neuron", "qkmap")


def tiny_capture():
    """The tiny ViT (sharpened, so the heads differ) and its capture of a brown photo with a blue block."""
    import torch
    from PIL import Image

    import attnviz
    from conftest import tiny_vit

    model = tiny_vit(seed=5)
    with torch.no_grad():
        for block in model.network.blocks:
            block.attn.qkv.weight[:64] *= 4.0
    picture = Image.new("RGB", (32, 32), (120, 80, 40))
    picture.paste((20, 160, 220), (8, 8, 24, 20))
    return model, picture, attnviz.capture(model, picture)


def page(view: str):
    """One view on the tiny ViT, every chart it offers recorded in ``offered`` (stem → Vega-Lite spec)."""
    import streamlit as st

    from attnviz_app import views
    from attnviz_app.views import ablation, faithfulness, neuron, norms, qkmap, stats
    from test_views_charts import tiny_capture

    model, picture, cap = tiny_capture()
    offered = st.session_state.setdefault("offered", {})
    modules = (stats, faithfulness, norms, ablation, neuron, qkmap)
    real = stats.download_chart

    def spy(chart, stem: str, key: str) -> None:
        offered[stem] = chart.to_dict()
        real(chart, stem, key)

    for module in modules:
        module.download_chart = spy
    try:
        views.registered()[view].show(views.Context(model, cap, picture, 1, 0, 0.6, "inferno", False, "crop"))
    finally:
        for module in modules:
            module.download_chart = real


def opened(view: str, lang: str) -> AppTest:
    at = AppTest.from_function(page, args=(view,), default_timeout=120)
    at.session_state["lang"] = lang
    at.session_state["faith_asked"] = ((), "token", False)  # the measurements run without a button press
    at.session_state["ablation_asked"] = ()
    at.session_state["ablation_off"] = ["1-2"]  # a head off: its ✕ mark is in the grids
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module", params=["en", "zh-TW"])
def pages(request):
    return request.param, {view: opened(view, request.param) for view in VIEWS}


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def marks(root: ET.Element, kind: str) -> list[int]:
    """How many marks each of the chart's own ``kind`` layers draws (rect, symbol, text, rule, image), in order;
    the layer that only holds the "Show data" table (views.common.table_layer) draws none and is left out."""
    counts = [len(list(g)) for g in root.iter(f"{SVG}g") if (g.get("class") or "").startswith(f"mark-{kind} role-mark")]
    return [n for n in counts if n]


# stem → words each file must hold as text (axis and panel titles, data labels), in English and in Chinese
WORDS = {
    "en": {
        "head_mean_attention_distance": ["Mean attention distance, in pixels of the 32 px input", "distance (px)",
                                         "layer", "head", "if it looked at all patches equally"],
        "head_cls_entropy": ["Entropy of the class token's attention", "entropy (nats)", "layer", "head"],
        "head_prefix_share": ["share to CLS / registers (%)", "layer", "head"],
        "deletion_insertion_curves_token": ["Deletion: top patches removed first", "Insertion: top patches put back first",
                                            "% of patches removed (deletion) / put back (insertion)",
                                            "probability of the predicted class"],
        "token_norms_by_layer": ["Patch-token norm ÷ median, by layer", "norm ÷ median", "layer", "largest patch",
                                 "99th percentile", "high-norm mark (3×)"],
        "token_norms_layer2_histogram": ["How many patches have each norm, after layer 2", "token norm", "patches"],
        "head_ablation_effect": ["Head", "Layer", "✕"],
        "head_entropy": ["Entropy of the class token's attention over the patches (nats): low = focused", "Head", "Layer", "✕"],
        "q_k_product_layer2_head1_query11_key12": ["q", "k", "q ⊙ k", "q, k and their elementwise product q_i · k_i, "
                                                   "dimension by dimension (layer 2, head 1, d_k = 8)"],
        "qk_map_layer2_head1_pca": ["first direction", "second direction", "query", "key", "Patch row"],
        "qk_atlas": ["Head", "Layer"],
    },
    "zh-TW": {
        "head_mean_attention_distance": ["平均注意力距離（32 像素輸入中的像素）", "距離（像素）", "層", "注意力頭", "平均地看所有圖塊時"],
        "head_cls_entropy": ["類別 token 注意力的熵", "熵（nat）", "層", "注意力頭"],
        "head_prefix_share": ["流向 CLS／暫存器的比例（%）", "層", "注意力頭"],
        "deletion_insertion_curves_token": ["刪除：先移除排名最前的圖塊", "插入：先放回排名最前的圖塊",
                                            "移除（刪除）／放回（插入）的圖塊百分比", "預測類別的機率"],
        "token_norms_by_layer": ["各層的圖塊 token 範數 ÷ 中位數", "範數 ÷ 中位數", "層", "最大的圖塊", "第 99 百分位數"],
        "token_norms_layer2_histogram": [],  # its words are checked in English; here only that it converts
        "head_ablation_effect": ["注意力頭", "層", "✕"],
        "head_entropy": ["類別 token 在圖塊上的注意力的熵（nat）：越低越集中", "注意力頭", "層", "✕"],
        "q_k_product_layer2_head1_query11_key12": ["q", "k", "q ⊙ k",
                                                   "q、k 與逐元素乘積 q_i · k_i，逐一維度（第 2 層，第 1 個注意力頭，d_k = 8）"],
        "qk_map_layer2_head1_pca": ["第一方向", "第二方向", "查詢", "鍵", "圖塊所在列"],
        "qk_atlas": ["注意力頭", "層"],
    },
}
OFFERED = {  # what each view offers: the tiny ViT's 2 layers × 4 heads, d_k = 8, query patch (2, 2) = token 11
    "stats": {"head_mean_attention_distance", "head_cls_entropy", "head_prefix_share"},
    "faithfulness": {"deletion_insertion_curves_token"},
    "norms": {"token_norms_by_layer", "token_norms_layer2_histogram"},
    "ablation": {"head_ablation_effect", "head_entropy"},
    "neuron": {"q_k_product_layer2_head1_query11_key12"},
    "qkmap": {"qk_map_layer2_head1_pca", "qk_atlas"},
}
LABELS = {"en": ("Download as SVG (vector)", "Download as PDF (vector)"), "zh-TW": ("下載 SVG（向量圖）", "下載 PDF（向量圖）")}


def test_each_chart_has_its_svg_and_pdf_buttons(pages):
    lang, apps = pages
    svg_label, pdf_label = LABELS[lang]
    for view, at in apps.items():
        labels = [b.label for b in at.get("download_button")]
        offered = set(at.session_state["offered"])
        assert offered == OFFERED[view], view
        assert labels.count(svg_label) == labels.count(pdf_label) == len(offered), (view, labels)
    stats_png = {"en": "Download all three panels (PNG)", "zh-TW": "下載三張圖合一（PNG）"}[lang]
    assert stats_png in [b.label for b in apps["stats"].get("download_button")]  # not "this picture": it is all three


def test_each_chart_is_a_self_contained_svg_and_a_pdf_with_its_words(pages):
    pypdf = pytest.importorskip("pypdf")
    pytest.importorskip("vl_convert")
    from fontTools.ttLib import TTFont

    from attnviz import figure

    lang, apps = pages
    if lang != "en" and not figure.cjk_font():
        pytest.skip("Noto Sans CJK TC is not installed (Debian: fonts-noto-cjk)")
    specs = {stem: spec for at in apps.values() for stem, spec in at.session_state["offered"].items()}
    assert set(specs) == set(WORDS[lang])
    for stem, spec in specs.items():
        svg = figure.chart_bytes(spec, "svg")
        root = ET.fromstring(svg)
        words = texts(root)
        assert set(WORDS[lang][stem]) <= set(words), (stem, sorted(set(words)))
        references = [v for e in root.iter() for k, v in e.attrib.items() if k.endswith("href")]
        assert all(r.startswith(("data:", "#")) for r in references), (stem, [r[:40] for r in references])
        assert not re.search(rb"url\((?!data:|#)", svg), stem  # fonts too: data: URIs; gradients by #id
        covered = set()
        for encoded in re.findall(rb"url\(data:font/otf;base64,([A-Za-z0-9+/=]+)\)", svg):
            covered |= set(TTFont(io.BytesIO(base64.b64decode(encoded))).getBestCmap())
        missing = {ch for ch in "".join(words) if not ch.isspace() and ord(ch) not in covered}
        assert not missing, (stem, missing)  # every character drawn from an embedded font: no boxes
        pdf = pypdf.PdfReader(io.BytesIO(figure.chart_bytes(spec, "pdf")))
        text = " ".join(page.extract_text() for page in pdf.pages)
        for word in WORDS[lang][stem]:
            if len(word) > 2:  # a one-letter label can be split by the reader; the titles cannot
                assert word in text, (stem, word, text)


def test_the_files_draw_the_capture_s_own_marks(pages):
    """Counted in the SVG: one cell per head, one strip cell per q/k dimension, one point per query and key."""
    pytest.importorskip("vl_convert")
    from attnviz import faithfulness as fa
    from attnviz import figure

    lang, apps = pages
    if lang != "en":
        pytest.skip("counted once, in English")
    specs = {stem: spec for at in apps.values() for stem, spec in at.session_state["offered"].items()}
    svg = lambda stem: ET.fromstring(figure.chart_bytes(specs[stem], "svg"))  # noqa: E731
    model, _, cap = tiny_capture()
    result = fa.faithfulness(model, cap, fill="token")
    target = int(cap.output.argmax())
    effect = svg("head_ablation_effect")
    assert marks(effect, "rect") == [2 * 4]  # layers × heads
    assert marks(effect, "text") == [1]  # the one head switched off (layer 2, head 3) has its ✕
    assert f"Drop in the probability of class {target}" in texts(effect)
    assert marks(svg("q_k_product_layer2_head1_query11_key12"), "rect") == [8, 8, 8]  # q, k, q ⊙ k over d_k = 8
    qk = svg("qk_map_layer2_head1_pca")
    assert sorted(marks(qk, "symbol")) == [1, 2, 16 + 16]  # the chosen query; CLS as query and key; the patches
    assert marks(qk, "rule") == [5]  # lines to the query's five top keys
    atlas = svg("qk_atlas")
    assert marks(atlas, "image") == [1] and marks(atlas, "rect")[0] == 1  # the atlas picture, the chosen head
    assert {"1", "2", "3", "4"} <= set(texts(atlas))
    assert marks(svg("head_cls_entropy"), "symbol") == [2 * 4]  # a dot per head and layer
    curves = texts(svg("deletion_insertion_curves_token"))
    assert {fa.map_name(c.ranking, "en") for c in result.curves} <= set(curves)


def shown_data(chart):
    """What the chart toolbar's "Show data" opens, as a data frame: Streamlit's frontend shows a chart's top-level
    data, else its first dataset (ArrowVegaLiteChart)."""
    import pyarrow as pa

    proto = chart.proto
    arrow = proto.data.data if proto.HasField("data") and proto.data.data else proto.datasets[0].data.data
    return pa.ipc.open_stream(arrow).read_all().to_pandas()


HEADERS = {  # view → the headers of each chart's "Show data" table, in the page's order
    "en": {
        "query": [["row", "column", "attention weight"]],
        "heads": [["layer", "head", "brightest patch (the most attention)", "attention weight"]],
        "neuron": [["row", "column", "attention weight"], ["dimension", "q", "k", "q ⊙ k"]],
        "stats": [["layer", "head", "distance (px)"], ["layer", "head", "share to CLS / registers (%)"],
                  ["layer", "head", "entropy (nats)"]],
        "norms": [["layer", "largest patch", "99th percentile"], ["row", "column", "token norm"]],
        "qkmap": [["Kind", "Token", "first direction", "second direction", "Patch row"],
                  ["Layer", "Head", "R with row", "R with column"]],
        "faithfulness": [["Map", "% of patches removed (deletion) / put back (insertion)", "deletion", "insertion"]],
    },
    "zh-TW": {
        "query": [["列", "行", "注意力權重"]],
        "heads": [["層", "注意力頭", "最亮的圖塊（注意力最多）", "注意力權重"]],
        "neuron": [["列", "行", "注意力權重"], ["維度", "q", "k", "q ⊙ k"]],
        "stats": [["層", "注意力頭", "距離（像素）"], ["層", "注意力頭", "流向 CLS／暫存器的比例（%）"], ["層", "注意力頭", "熵（nat）"]],
        "norms": [["層", "最大的圖塊", "第 99 百分位數"], ["列", "行", "token 範數"]],
        "qkmap": [["種類", "Token", "第一方向", "第二方向", "圖塊所在列"], ["層", "注意力頭", "與列的 R", "與行的 R"]],
        "faithfulness": [["圖", "移除（刪除）／放回（插入）的圖塊百分比", "刪除", "插入"]],
    },
}


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_show_data_opens_the_numbers_each_chart_draws(lang):
    """A chart's "Show data" was its first layer's data: a picture's data URL, a line's end points, under internal
    names. Now it is a table of what the chart draws, headed in the page's language, and its numbers are the
    capture's: recomputed here from the captured q and k, with numpy."""
    import numpy as np

    from attnviz import i18n

    model, _, cap = tiny_capture()
    tables = {}
    for view in HEADERS[lang]:
        at = opened(view, lang)
        charts = [c for c in at.get("vega_lite_chart") if c.proto.datasets or c.proto.HasField("data")]
        tables[view] = [shown_data(c) for c in charts]
    for view, headers in HEADERS[lang].items():
        shown = [list(table.columns) for table in tables[view]]
        if view == "neuron":  # the query picker draws the plain photo: no numbers, and BASE_CSS hides its button
            assert shown[0] == ["col", "row", "c1", "r1", "url"], shown
            shown = shown[1:]
        assert shown == headers, (view, shown)

    def cls_rows(layer: int) -> np.ndarray:  # (H, N), the class token's softmax(q kᵀ · scale), independently
        q, k = Q(cap)[layer].double().numpy(), K(cap)[layer].double().numpy()  # (H, N, d)
        logits = np.einsum("hd,hnd->hn", q[:, 0], k) * SCALE(cap)
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    p, (h, w) = cap.num_prefix_tokens, cap.grid
    # the harness's page: layer 2 (index 1), head 1, the class token as the query
    query = tables["query"][0]
    np.testing.assert_array_equal(query.iloc[:, 0], np.repeat(np.arange(1, h + 1), w))  # row by row, from 1
    np.testing.assert_array_equal(query.iloc[:, 1], np.tile(np.arange(1, w + 1), h))
    np.testing.assert_allclose(query.iloc[:, 2], cls_rows(1)[0, p:], atol=1e-6)
    heads = tables["heads"][0]
    assert len(heads) == cap.num_layers * (cap.num_heads + 1)
    for (_, row), (layer, column) in zip(heads.iterrows(), np.ndindex(cap.num_layers, cap.num_heads + 1)):
        rows = cls_rows(layer)[:, p:]
        patches = rows[column] if column < cap.num_heads else rows.mean(0)
        top = int(patches.argmax())
        assert row.iloc[2] == i18n.text(lang, "analysis.patch", row=top // w + 1, col=top % w + 1), row.iloc[2]
        assert abs(row.iloc[3] - patches[top]) <= 1e-6
    strip = tables["neuron"][2]
    q, k = Q(cap)[1, 0].double().numpy(), K(cap)[1, 0].double().numpy()
    query_token, key_token = 1 + 2 * w + 2, 1 + 2 * w + 3  # the harness's neuron pair: patches (2, 2) and (2, 3)
    np.testing.assert_allclose(strip.iloc[:, 1], q[query_token], atol=1e-6)
    np.testing.assert_allclose(strip.iloc[:, 2], k[key_token], atol=1e-6)
    np.testing.assert_allclose(strip.iloc[:, 3], q[query_token] * k[key_token], atol=1e-6)
    for view, found in tables.items():  # nothing of a picture's data URL is left in any table
        assert not any(found_table.astype(str).apply(lambda c: c.str.startswith("data:image")).any().any()
                       for found_table in found[1 if view == "neuron" else 0:]), view


def test_the_q_k_map_lists_its_top_keys_with_the_language_s_comma():
    """The sentence under the map names the query's five top keys: "…, …" in English, "…、…" in Chinese."""
    from attnviz import i18n

    for lang, comma in (("en", "), patch ("), ("zh-TW", "）、圖塊（")):
        at = opened("qkmap", lang)
        words = i18n.text(lang, "qkmap.lines", query="@", top="@", n=5).split("@")[1]  # between the query and the keys
        line = next(m.value for m in at.markdown if words in m.value)
        assert line.count(comma) >= 3, line  # five keys, most of them patches
        if lang == "zh-TW":
            assert ", " not in line.split(words, 1)[1], line


def untitled_tooltips(spec) -> list[str]:
    """The fields of a Vega-Lite spec's tooltips that have no title of their own: a tooltip (and the description a
    screen reader hears, which Vega-Lite builds from the same titles) then shows the code's column name, in English
    on a Chinese page ("distance", "series", "ratio")."""
    found = []
    if isinstance(spec, dict):
        tips = spec.get("encoding", {}).get("tooltip", [])
        for tip in tips if isinstance(tips, list) else [tips]:
            if isinstance(tip, dict) and "field" in tip and "title" not in tip:
                found.append(tip["field"])
        for value in spec.values():
            found += untitled_tooltips(value)
    elif isinstance(spec, list):
        for value in spec:
            found += untitled_tooltips(value)
    return found


GUIDES = {"x": "axis", "y": "axis", "color": "legend", "fill": "legend", "stroke": "legend", "shape": "legend",
          "size": "legend", "opacity": "legend", "strokeDash": "legend"}


def undescribed_guides(spec) -> set[str]:
    """The channels of a Vega-Lite spec that draw an axis or legend (a field, the guide not switched off) which no
    layer describes: Vega then tells a screen reader "Y-axis titled '層' for a linear scale…", in English."""
    drawn, described = set(), set()

    def walk(part) -> None:
        if isinstance(part, list):
            for value in part:
                walk(value)
        if not isinstance(part, dict):
            return
        for channel, kind in GUIDES.items():
            ch = part.get("encoding", {}).get(channel)
            if isinstance(ch, dict) and ("field" in ch or "aggregate" in ch) and ch.get(kind, {}) is not None:
                drawn.add(channel)
                if (ch.get(kind) or {}).get("description"):
                    described.add(channel)
        for value in part.values():
            walk(value)

    walk(spec)
    return drawn - described


def test_every_tooltip_says_what_it_shows_in_the_page_s_language():
    """Each value a chart's tooltip shows has its own title, in the page's language."""
    import json

    from attnviz import i18n

    specs = {view: [json.loads(chart.proto.spec) for chart in opened(view, "zh-TW").get("vega_lite_chart")]
             for view in HEADERS["zh-TW"]}
    for view, charts in specs.items():
        for spec in charts:
            assert untitled_tooltips(spec) == [], view
            assert undescribed_guides(spec) == set(), view  # and each axis and legend, for a screen reader
    query = json.dumps(specs["query"][0], ensure_ascii=False)
    assert '"title": "注意力權重"' in query  # a map's cell tells its weight on hover
    stats = specs["stats"][0]
    assert i18n.text("zh-TW", "analysis.stats.distance_axis") in json.dumps(stats["layer"][1]["encoding"]["tooltip"],
                                                                            ensure_ascii=False)
    said = json.dumps(stats, ensure_ascii=False)
    assert '"description": "X 軸：層"' in said and '"description": "圖例：注意力頭"' in said
