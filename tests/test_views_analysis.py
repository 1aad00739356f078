"""The analysis views through AppTest (numbers on the page checked against the core), and the
clickable pictures in a real browser."""
from __future__ import annotations

import math

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.images import open_image
from attnviz.masks import mass_mask
from attnviz.rollout import rollout_map
from attnviz_app.settings import DEFAULT_PHOTO
from conftest import APP, ROOT, Q, K

ANALYSIS_VIEWS = ("query", "matrix", "heads", "rollout", "mask", "stats", "relevance")


@pytest.fixture(scope="module")
def app():
    return AppTest.from_file(str(APP), default_timeout=180).run()


@pytest.fixture(scope="module")
def page_capture(real_model):
    """The capture the page makes of its first photo (settings.DEFAULT_PHOTO, centre crop)."""
    image = open_image(attnviz.photos.sample(DEFAULT_PHOTO).read_bytes(), f"{DEFAULT_PHOTO}.jpg").image
    return attnviz.capture(real_model, image)


def choose(at, view: str):
    at.selectbox(key="view").set_value(view).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def scales(at) -> list[tuple[float, float]]:
    """(dark, bright) of every colour-scale caption on the page, top to bottom."""
    return [scale_numbers(c.value) for c in at.caption if c.value.startswith("Colour scale")]


def scale_numbers(text: str) -> tuple[float, float]:
    """(dark, bright) from a colour-scale caption."""
    parts = text.split("=")
    return float(parts[1].split(",")[0].split("(")[0]), float(parts[2].split("(")[0].strip().rstrip(","))


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_every_view_draws_without_running_the_model(lang, real_model, monkeypatch):
    calls = []
    for view in ANALYSIS_VIEWS:
        at = AppTest.from_file(str(APP), default_timeout=180)
        # Chosen before the run: AppTest cannot re-run a page whose radio labels follow the session's language.
        at.session_state["lang"] = lang
        at.session_state["view"] = view
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.get("download_button") or view == "relevance"
        if not calls:  # from here on the model and capture come from the cache
            original = attnviz.capture
            monkeypatch.setattr(attnviz, "capture", lambda *a, **k: calls.append(1) or original(*a, **k))
            calls.append(0)
    assert calls == [0]


def test_query_view_any_token(app, page_capture):
    choose(app, "query")
    assert app.subheader[0].value == "Layer 12, mean of all heads: where does class token [CLS] look?"
    own = page_capture.row(11, "mean", 0)[0]
    assert f"**{own:.4f}**" in app.markdown[-1].value
    # the prefix tokens' table: the class token's weight recomputed from the layer's q and k, mean of the heads
    q, k = Q(page_capture)[11].double(), K(page_capture)[11].double()  # (H, N, d)
    weights = ((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5).softmax(-1).mean(0)
    table = next(m.value for m in app.markdown if m.value.startswith("| key token | attention weight |"))
    assert f"| class token [CLS] | {float(weights[0, 0]):.4f} |" in table.splitlines(), table
    (lo, hi), = scales(app)
    grid = page_capture.cls_map(11, "mean")
    assert (lo, hi) == (round(float(grid.min()), 4), round(float(grid.max()), 4))


def test_matrix_row_choice_is_the_query_of_the_query_view(app, page_capture):
    choose(app, "matrix")
    assert app.subheader[0].value == "Layer 12, mean of all heads: the full 197 × 197 attention matrix"
    app.selectbox(key="matrix_query").set_value(50).run()  # token 50 = patch 49 = row 4, column 8
    choose(app, "query")
    assert app.subheader[0].value == "Layer 12, mean of all heads: where does patch (row 4, column 8) look?"
    assert f"**{page_capture.row(11, 'mean', 50)[50]:.4f}**" in app.markdown[-1].value
    app.selectbox(key="query_token").set_value(0).run()
    assert "class token [CLS]" in app.subheader[0].value


def test_matrix_npz_holds_the_whole_capture(page_capture, real_model, tmp_path):
    import io

    import attnviz
    from attnviz_app.views.matrix import npz_bytes

    data = npz_bytes(page_capture, real_model)
    arrays = np.load(io.BytesIO(data))
    assert arrays["attention"].shape == (12, 6, 197, 197)
    np.testing.assert_allclose(arrays["attention"][4, 2], page_capture.weights(4, 2), atol=0)
    assert tuple(arrays["grid"]) == (14, 14) and int(arrays["num_prefix_tokens"]) == 1
    # the same file as the CLI's export: it loads back into a capture with the same weights
    (tmp_path / "page.npz").write_bytes(data)
    again = attnviz.load_capture(tmp_path / "page.npz")
    np.testing.assert_array_equal(again.weights(11, "mean"), page_capture.weights(11, "mean"))
    assert attnviz.export.read_meta(tmp_path / "page.npz")["format"] == "full"


CHINESE_FIGURE = """
import warnings
from matplotlib import font_manager
from matplotlib.figure import Figure
# a font list cached before the CJK font was installed: matplotlib knows no CJK face
font_manager.fontManager.ttflist = [f for f in font_manager.fontManager.ttflist if "CJK" not in f.name]
from attnviz_app.views.common import figure_png

figure = Figure()
figure.text(0.5, 0.5, "注意力權重")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    figure_png(figure)
print(sum("missing from font" in str(w.message) for w in caught))
"""


def test_the_pages_figures_draw_chinese_with_the_cjk_font_a_stale_font_list_lacks():
    """The matrix and statistics figures' Chinese labels drew as boxes where matplotlib's font list predated the
    font (one warning per missing glyph): figure_png registers the font first, as attnviz.figure does."""
    from attnviz import figure

    if figure._font_file(figure.CJK_FONT) is None:
        pytest.skip("Noto Sans CJK TC is not installed (Debian: fonts-noto-cjk)")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CHINESE_FIGURE], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=True)
    assert done.stdout.split()[-1] == "0", done.stdout + done.stderr


def test_rollout_view_numbers(app, page_capture):
    choose(app, "rollout")
    app.slider(key="rollout_layers").set_value((3, 10)).run()
    app.selectbox(key="rollout_fusion").set_value("max").run()
    assert app.subheader[0].value == "Attention rollout: layers 3–10, max over heads"
    (raw_lo, raw_hi), (lo, hi) = scales(app)
    expected = rollout_map(page_capture, 2, 9, "max")
    assert (lo, hi) == (round(float(expected.min()), 4), round(float(expected.max()), 4))
    raw = page_capture.cls_map(9, "max")
    assert (raw_lo, raw_hi) == (round(float(raw.min()), 4), round(float(raw.max()), 4))


def test_mask_view_counts(app, page_capture):
    choose(app, "mask")
    mask = mass_mask(page_capture.cls_map(11, "mean"), 0.6)
    assert app.markdown[-1].value.startswith(f"{mask.count} of 196 patches")
    app.slider(key="mask_mass").set_value(90).run()
    mask = mass_mask(page_capture.cls_map(11, "mean"), 0.9)
    assert app.markdown[-1].value.startswith(f"{mask.count} of 196 patches")
    app.radio(key="mask_source").set_value("heads").run()
    head3 = mass_mask(page_capture.cls_map(11, 2), 0.9).count
    assert not app.exception
    assert f"Head 3: {head3} patches" in [img.proto.imgs[0].caption for img in app.get("image")]


def test_stats_view_reference_lines(app):
    choose(app, "stats")
    captions = " ".join(c.value for c in app.caption)
    assert f"ln N = {math.log(197):.2f}" in captions and "197 tokens" in captions
    assert "One patch is 14 px wide" in captions


def test_stats_view_says_what_its_distance_panel_shows(app, page_capture):
    """The sentence under the explanation is this capture's numbers, read here with plain numpy."""
    from attnviz.stats import head_stats

    stats = head_stats(page_capture)
    d = stats.distance  # (12, 6)
    ll, lh = np.unravel_index(d.argmin(), d.shape)
    fl, fh = np.unravel_index(d.argmax(), d.shape)
    first, second = round(d[:6].mean()), round(d[6:].mean())
    expected = (f"The most local head is head {lh + 1} of layer {ll + 1} ({d[ll, lh]:.0f} px, "
                f"{d[ll, lh] / 14:.1f} patches), the most global head {fh + 1} of layer {fl + 1} ({d[fl, fh]:.0f} px); "
                f"a patch looking at all patches equally would look {stats.uniform_distance:.0f} px far. "
                f"Averaged over their heads, layers 1–6 look {first} px far and layers 7–12 {second} px: "
                f"{'farther' if second > first else 'nearer'} with depth.")
    choose(app, "stats")
    assert expected in [i.value for i in app.info]
    assert first != second  # the photo's halves differ: the direction word is tested


def test_relevance_view_explains_itself_without_a_classifier(app):
    choose(app, "relevance")
    assert all(s.key != "relevance_class_disabled" for s in app.selectbox)
    assert "needs a classifier" in app.info[-1].value and "vit_base_patch16_224" in app.info[-1].value


def relevance_script():
    import attnviz
    from attnviz_app.views import Context, relevance
    from conftest import tiny_vit
    from PIL import Image

    model = tiny_vit(num_classes=10)
    image = Image.open(attnviz.photos.sample("cat"))
    cap = attnviz.capture(model, image)
    relevance.show(Context(
        model=model, cap=cap, view=model.view(image), layer=1, head="mean", alpha=0.6, cmap="inferno",
        smooth=False, fit="crop",
    ))


def test_relevance_view_on_a_classifier(cat):
    from conftest import tiny_vit
    from attnviz.relevance import relevance_map

    at = AppTest.from_function(relevance_script, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    model = tiny_vit(num_classes=10)
    cap = attnviz.capture(model, cat)
    probs = cap.output.softmax(-1)
    order = probs.argsort(descending=True).tolist()
    assert len(at.radio[0].options) == 5
    for choice in (0, 3):
        j = order[choice]
        at.radio[0].set_value((j, model.labels[j], float(probs[j]))).run()
        grid = relevance_map(model, cap, order[choice])
        (lo, hi), = scales(at)
        assert (lo, hi) == (round(float(grid.min()), 4), round(float(grid.max()), 4))
        assert at.subheader[0].value == f"Class-specific map for “{model.labels[order[choice]]}”"


def heads_script():
    import streamlit as st

    from attnviz_app.views.heads import apply_cell

    cell = {"layer": st.session_state["pick_layer"], "head": st.session_state["pick_head"]}
    apply_cell({"selection": {"cell": [cell]}})
    apply_cell({"selection": {"cell": []}})  # a click on nothing changes nothing
    st.text(repr((st.session_state["layer"], st.session_state["head"])))


@pytest.mark.parametrize("head, expected", [("2", 2), ("mean", "mean")])
def test_choosing_a_cell_sets_layer_and_head(head, expected):
    at = AppTest.from_function(heads_script)
    at.session_state["root"] = str(ROOT)
    at.session_state["pick_layer"] = 7
    at.session_state["pick_head"] = head
    at.run()
    assert at.text[0].value == repr((7, expected))


@pytest.mark.browser
def test_clicking_a_patch_and_a_cell_in_a_real_browser(app_in_chromium):
    from playwright.sync_api import expect

    from serve import choose_view, drawn

    url, browser = app_in_chromium
    page = browser.new_page(viewport={"width": 1400, "height": 2000})
    page.goto(url)
    page.wait_for_selector("text=What was computed", timeout=120_000)

    choose_view(page, "Any query token → patches")
    page.get_by_text("where does class token [CLS] look?").wait_for(timeout=60_000)
    drawn(page, "[data-testid='stVegaLiteChart']")
    box = page.locator("[data-testid='stVegaLiteChart']").first.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 10.5 / 14, box["y"] + box["height"] * 3.5 / 14)
    page.get_by_text("where does patch (row 4, column 11) look?").wait_for(timeout=60_000)
    # the address bar follows the click, once the view is drawn: a link to it opens this query. (Waiting with
    # time.sleep would not do: Playwright's sync API learns of the new address only while it is called.)
    page.wait_for_url("**query=r4c11**", timeout=30_000)
    assert "view=query" in page.url, page.url

    choose_view(page, "All layers and heads at a glance")
    page.get_by_text("All 12 layers × 6 heads at a glance").wait_for(timeout=60_000)
    drawn(page, "[data-testid='stVegaLiteChart']")  # Vega has laid the grid out: its box is where the cells are
    chart = page.locator("[data-testid='stVegaLiteChart']").first.bounding_box()
    # 12 rows × 7 columns (6 heads + mean) of STEP px; the plot ends at the chart's right and bottom edges
    from attnviz_app.views.heads import CELL_PX

    step = CELL_PX + 8
    right, bottom = chart["x"] + chart["width"], chart["y"] + chart["height"]
    page.mouse.click(right - step * (7 - 1 - 0.5), bottom - step * (12 - 2 - 0.5))  # layer 3, head 2
    slider = page.locator("[data-testid='stSlider']").filter(has_text="Layer")
    layer = slider.locator("[data-testid='stSliderThumbValue']")
    expect(layer).to_have_text("3", timeout=60_000)
    head = page.locator("[data-testid='stSelectbox']").filter(has_text="Head").locator("input")
    assert head.input_value() == "head 2"
    page.close()


@pytest.mark.parametrize("view", ["query", "neuron"])
def test_clickable_pictures_are_svg_at_every_size(view):
    """Streamlit draws a chart of over 2000 data points on a canvas unless the spec says otherwise, and a canvas is
    not scaled into a narrow column (its clicks would land wrong). A clickable picture's grid (37 × 37 cells at
    518 px; 56 × 56 for 8 px patches at 448) says SVG."""
    import json

    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["size"], at.session_state["view"] = 518, view
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    import pyarrow as pa

    charts = [(json.loads(chart.proto.spec), chart.proto.datasets) for chart in at.get("vega_lite_chart")]
    pictures = [(spec, data) for spec, data in charts
                if any(layer.get("mark", {}).get("type") == "image" for layer in spec.get("layer", []))]
    assert pictures, [spec.get("usermeta") for spec, _ in charts]
    for spec, data in pictures:
        assert spec["usermeta"]["embedOptions"]["renderer"] == "svg"
        cells = max(pa.ipc.open_stream(d.data.data).read_all().num_rows for d in data)
        assert cells == 37 * 37  # one clickable cell per patch of the 518 px grid


def _marks(spec):
    """Every mark of a Vega-Lite spec, with the encoding beside it: (mark dict, encoding dict)."""
    if isinstance(spec, dict):
        if "mark" in spec:
            mark = spec["mark"] if isinstance(spec["mark"], dict) else {"type": spec["mark"]}
            yield mark, spec.get("encoding", {})
        for value in spec.values():
            yield from _marks(value)
    elif isinstance(spec, list):
        for value in spec:
            yield from _marks(value)


@pytest.mark.parametrize("view, spoken", [("query", "patch (row 3, column 4): attention weight 0."),
                                          ("heads", "Layer 3, head 2"), ("qkmap", "query · patch (row 3, column 4)")])
def test_a_screen_reader_gets_a_name_for_each_cell_and_never_a_picture_s_data_url(view, spoken):
    """Vega names each mark for screen readers from its data: a picture's mark was read out as its data URL (tens
    of kB of base64) and a cell as "col: 3; row: 2; c1: 4; r1: 3". Pictures are hidden from it; cells, tiles and
    points say which patch or head they are, in the page's language, and a map's cell its weight; the chart itself by
    its heading (not "Vega visualization")."""
    import json

    import pyarrow as pa

    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["view"] = view
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    described = []
    headings = {h.value for h in at.subheader}
    names = [chart.proto.alt for chart in at.get("vega_lite_chart")]
    assert names and names[0] in headings, (names, headings)  # the chart is named by the heading above it
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        marks = list(_marks(spec))
        for mark, encoding in marks:
            if mark["type"] == "image":
                assert mark.get("aria") is False, mark
            if "description" in encoding:
                field = encoding["description"]["field"]
                for data in chart.proto.datasets:
                    table = pa.ipc.open_stream(data.data.data).read_all()
                    if field in table.column_names:
                        described += table.column(field).to_pylist()
    assert any(name == spoken or name.startswith(spoken) and view == "query" for name in described), described[:5]
