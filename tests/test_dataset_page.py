"""The Dataset page opens a run's output (only from the folder the server's owner chose) in both languages."""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from attnviz import i18n
from attnviz.dataset import RunConfig, read_run, run_local

from conftest import APP
from dataset_fixtures import SMALL, one_thread, photo_folder  # noqa: F401 (autouse fixture)
from test_views_charts import shown_data, undescribed_guides



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    run_local(photo_folder(root / "in"), root / "small-run", RunConfig(size=SMALL), progress=False)
    return root


def open_page(lang: str, monkeypatch, root) -> AppTest:
    monkeypatch.setenv("ATTNVIZ_DATASETS", str(root))
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = lang
    return at.switch_page("screens/dataset.py").run()


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_page_opens_a_run(runs, monkeypatch, lang):
    at = open_page(lang, monkeypatch, runs)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error and not at.warning, [e.value for e in [*at.error, *at.warning]]
    assert at.title[0].value == i18n.text(lang, "dataset.title")
    assert at.selectbox(key="dataset_run").value == str(runs / "small-run")
    shown = "\n".join(m.value for m in at.markdown)
    assert i18n.text(lang, "dataset.counts", images=4, errors=1) in shown
    assert len(at.get("vega_lite_chart")) == 1
    labels = [b.label for b in at.get("download_button")]  # the heads chart as vector files, for papers
    assert labels.count(i18n.text(lang, "figure.download_svg")) == labels.count(i18n.text(lang, "figure.download_pdf")) == 1
    # The chosen head's photos: layer 12, head 1 ranked by mean distance, smallest first, with their maps.
    heads = read_run(runs / "small-run").heads.to_pandas()
    rows = heads[(heads["layer"] == 11) & (heads["head"] == 0)].sort_values("distance_px")
    captions = [img.caption for el in at.get("image") for img in el.proto.imgs]
    assert len(captions) == 4
    assert [c.split(" · ")[0] for c in captions] == [p.rsplit("/", 1)[1] for p in rows["path"]]
    assert f"{rows['distance_px'].iloc[0]:.1f}" in captions[0]
    # The chart's "Show data": one row per head, headed in the page's language, its mean over the photos
    table = shown_data(at.get("vega_lite_chart")[0])
    assert list(table.columns) == [i18n.text(lang, f"dataset.{k}") for k in
                                   ("layer", "head", "distance_axis", "entropy_axis", "images")]
    head = table[(table.iloc[:, 0] == 12) & (table.iloc[:, 1] == 1)].iloc[0]
    assert abs(head.iloc[2] - rows["distance_px"].mean()) <= 1e-4 and abs(head.iloc[3] - rows["entropy"].mean()) <= 1e-4
    assert head.iloc[4] == 4
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)  # its axes told to a screen reader in this language
    assert undescribed_guides(spec) == set()
    assert i18n.text(lang, "chart.y_axis", title=i18n.text(lang, "dataset.entropy_axis")) in json.dumps(
        spec, ensure_ascii=False)
    reason = at.dataframe[0].value.iloc[0, 1]
    assert reason == i18n.text(lang, "images.unreadable", name="notes.jpg", formats=i18n.text(lang, "images.formats"))


def test_other_ranking_and_head(runs, monkeypatch):
    at = open_page("en", monkeypatch, runs)
    at.selectbox(key="dataset_layer").select(3).run()
    at.selectbox(key="dataset_head").select(2).run()
    at.radio(key="dataset_ranking.en").set_value("focused").run()
    heads = read_run(runs / "small-run").heads.to_pandas()
    rows = heads[(heads["layer"] == 2) & (heads["head"] == 1)].sort_values(["mass60_fraction", "path"])
    captions = [img.caption for el in at.get("image") for img in el.proto.imgs]
    assert [c.split(" · ")[0] for c in captions] == [p.rsplit("/", 1)[1] for p in rows["path"]]
    errors = at.dataframe[0].value
    assert errors.iloc[0].tolist() == ["notes.jpg", i18n.text("en", "images.unreadable", name="notes.jpg",
                                                               formats=i18n.text("en", "images.formats"))]


def test_no_folder_chosen_tells_a_visitor_what_the_page_is_for_and_the_owner_how(monkeypatch):
    """A visitor reads one sentence and a link back to Explore; the owner's environment variable and command are
    folded under it, not the first thing on the page."""
    monkeypatch.delenv("ATTNVIZ_DATASETS", raising=False)
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = "zh-TW"
    at.switch_page("screens/dataset.py").run()
    assert not at.exception
    assert [i.value for i in at.info] == [i18n.text("zh-TW", "dataset.nothing_yet")]
    assert "ATTNVIZ_DATASETS" not in at.info[0].value
    link = at.get("page_link")[0].proto
    assert link.label == i18n.text("zh-TW", "dataset.back") and link.page_script_hash  # a page of this app
    folded = at.expander[0]
    assert folded.label == i18n.text("zh-TW", "dataset.for_owner")
    assert "ATTNVIZ_DATASETS" in folded.markdown[0].value and i18n.text("zh-TW", "dataset.unset") in folded.markdown[0].value
    assert not at.text_input  # no field where a browser could type a server path


def test_the_heads_chart_downloads_as_svg_and_pdf(runs, monkeypatch):
    """The chart the page draws, as its SVG / PDF buttons convert it: titled, self-contained, readable."""
    import io
    import xml.etree.ElementTree as ET

    pypdf = pytest.importorskip("pypdf")
    from attnviz import figure
    from attnviz_app.views import common

    offered = {}
    real = common.download_chart
    monkeypatch.setattr(common, "download_chart", lambda chart, stem, key: (offered.update({stem: chart.to_dict()}),
                                                                           real(chart, stem, key)))
    at = open_page("en", monkeypatch, runs)
    assert not at.exception
    spec = offered["dataset_heads_distance_entropy"]
    svg = figure.chart_bytes(spec, "svg")
    words = " ".join(e.text or "" for e in ET.fromstring(svg).iter())
    assert i18n.text("en", "dataset.scatter_header") in words
    assert b"http" not in svg.replace(b"http://www.w3.org", b"")  # nothing fetched from outside the file
    pdf = pypdf.PdfReader(io.BytesIO(figure.chart_bytes(spec, "pdf")))
    assert "layer" in " ".join(page.extract_text() for page in pdf.pages).lower()


def test_a_link_opens_the_run_layer_head_and_ranking_it_names(runs, monkeypatch):
    """/dataset?layer=3&head=2&run=small-run&ranking=focused: a colleague opens the same head's photos."""
    monkeypatch.setenv("ATTNVIZ_DATASETS", str(runs))
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update(layer="3", head="2", run="small-run", ranking="focused")
    at.switch_page("screens/dataset.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="dataset_layer").value == 3 and at.selectbox(key="dataset_head").value == 2
    assert at.session_state["dataset_ranking"] == "focused"
    heads = read_run(runs / "small-run").heads.to_pandas()
    rows = heads[(heads["layer"] == 2) & (heads["head"] == 1)].sort_values(["mass60_fraction", "path"])
    captions = [img.caption for el in at.get("image") for img in el.proto.imgs]
    assert [c.split(" · ")[0] for c in captions] == [p.rsplit("/", 1)[1] for p in rows["path"]]
    nearest = heads[(heads["layer"] == 2) & (heads["head"] == 1)].sort_values(["distance_px", "path"])
    assert list(nearest["path"]) != list(rows["path"])  # the ranking's own order, not the first ranking's
    assert at.query_params == {"layer": "3", "head": "2", "run": "small-run", "ranking": "focused", "lang": "en"}
    at.selectbox(key="dataset_head").select(4).run()  # the address follows the page
    assert at.query_params["head"] == "4" and at.selectbox(key="dataset_layer").value == 3


@pytest.mark.parametrize("params", [
    {"layer": "13", "head": "7", "run": "../in", "ranking": "largest"},  # the run has 12 layers of 6 heads
    {"layer": "0", "head": "x", "run": "", "ranking": ""},
])
def test_a_dataset_link_s_values_the_run_does_not_offer_are_left_out(runs, monkeypatch, params):
    monkeypatch.setenv("ATTNVIZ_DATASETS", str(runs))
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update(params)
    at.switch_page("screens/dataset.py").run()
    assert not at.exception and at.selectbox(key="dataset_run").value == str(runs / "small-run")
    assert at.selectbox(key="dataset_layer").value == 12 and at.selectbox(key="dataset_head").value == 1
    assert at.query_params == {"layer": "12", "head": "1", "run": "small-run", "ranking": "local", "lang": "en"}
