"""The WebGL scatter's Python side (attnviz_app/qk_scatter.py): the bytes the browser reads hold every point of
the Q/K map exactly — its place, colour and kind, photo and token — with the words, names and legend."""
from __future__ import annotations

import fnmatch
import tomllib

import matplotlib
import numpy as np
import pytest
import torch

import attnviz
from attnviz import qkmap
from attnviz_app import qk_scatter
from conftest import ROOT, tiny_vit

WORDS = {"query": "query", "key": "key", "kind": "Kind", "token": "Token", "photo": "Photo",
         "axis_1": "first direction", "axis_2": "second direction", "no_webgl": "no WebGL"}
VIRIDIS_ENDS = ((68, 1, 84), (253, 231, 37))  # matplotlib's viridis at 0 and 1, × 255, rounded
TAB10 = ((31, 119, 180), (255, 127, 14), (44, 160, 44))  # #1f77b4, #ff7f0e, #2ca02c


@pytest.fixture(scope="module")
def three():
    model = tiny_vit()
    torch.manual_seed(2)
    caps = [attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32)) for _ in range(3)]
    return caps, qkmap.qk_map(caps, 1, 2)


def test_every_point_is_the_maps(three):
    caps, qk = three
    values = qkmap.colour_values(qk, caps, "row") + 1  # 1 … 4, NaN for the class token
    labels = [f"token {i}" for i in range(qk.num_tokens)]
    data = qk_scatter.payload(qk, values, ["a.jpg", "狗.png", "c.jpg"], labels, "Patch row", False, WORDS)
    head, points = qk_scatter.unpack(data)
    assert len(data) % 16 == 0 and len(points) == len(qk.token) == 3 * 2 * 17
    assert np.array_equal(points["x"], qk.xy[:, 0].astype(np.float32))
    assert np.array_equal(points["y"], qk.xy[:, 1].astype(np.float32))
    assert np.array_equal(points["kind"], qk.is_key.astype(np.uint8))  # 0 query, 1 key
    assert np.array_equal(points["photo"], qk.photo) and np.array_equal(points["token"], qk.token)
    # viridis from row 1 (its dark end) to row 4 (its bright end), in 256 steps; the class token grey
    lut = (matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255 + 0.5).astype(np.uint8)
    finite = np.isfinite(values)
    steps = np.round((values[finite] - 1) / 3 * 255).astype(int)
    assert np.array_equal(points["rgb"][finite], lut[steps])
    assert [tuple(c) for c in points["rgb"][values == 1]][:1] == [VIRIDIS_ENDS[0]]
    assert [tuple(c) for c in points["rgb"][values == 4]][:1] == [VIRIDIS_ENDS[1]]
    assert (points["rgb"][~finite] == qk_scatter.NO_VALUE).all() and (~finite).sum() == 6  # 3 photos × q, k
    assert head["names"] == ["a.jpg", "狗.png", "c.jpg"] and head["labels"] == labels and head["words"] == WORDS
    assert head["legend"]["title"] == "Patch row" and (head["legend"]["lo"], head["legend"]["hi"]) == ("1", "4")
    assert head["legend"]["stops"][0] == "#440154" and head["legend"]["stops"][-1] == "#fde725"
    assert head["legend"]["none"] and head["margin"] == qk_scatter.MARGIN


def test_photos_are_coloured_in_turn_and_the_id_follows_the_places(three):
    caps, qk = three
    photo = qkmap.colour_values(qk, caps, "photo")
    names = [f"{i}.jpg" for i in range(3)]
    head, points = qk_scatter.unpack(qk_scatter.payload(qk, photo, names, ["t"] * 17, "Photo", True, WORDS))
    assert [tuple(points["rgb"][qk.photo == p][0]) for p in range(3)] == list(TAB10)
    assert (points["rgb"] == np.asarray(TAB10)[qk.photo]).all()
    assert head["legend"]["entries"] == [["0.jpg", "#1f77b4"], ["1.jpg", "#ff7f0e"], ["2.jpg", "#2ca02c"]]
    assert "more" not in head["legend"] and "stops" not in head["legend"]
    eleven = qk_scatter.legend(np.arange(11.0), [f"{i}.jpg" for i in range(11)], "Photo", True)
    assert len(eleven["entries"]) == 10 and eleven["entries"][9] == ["9.jpg", "#17becf"]  # tab10's last
    assert eleven["more"] == "… and 1 more (the colours repeat)"
    # The same places with other colours keep the browser's view; other places do not.
    other, _ = qk_scatter.unpack(qk_scatter.payload(qk, photo * 0, names, ["t"] * 17, "Photo", True, WORDS))
    moved = qkmap.qk_map(caps, 0, 1)
    third, _ = qk_scatter.unpack(qk_scatter.payload(moved, photo, names, ["t"] * 17, "Photo", True, WORDS))
    assert head["id"] == other["id"] != third["id"]


def test_the_wheel_carries_the_browser_side():
    with open(ROOT / "pyproject.toml", "rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["package-data"]["attnviz_app"]
    for name in ("qk_scatter.js", "qk_scatter.css"):
        assert (ROOT / "attnviz_app" / name).is_file()
        assert any(fnmatch.fnmatch(name, p) for p in patterns), (name, patterns)
    # The record layout the JavaScript reads (its header comment and its offsets 0, 4, 8, 11, 12, 14).
    fields = qk_scatter.RECORD.fields
    assert qk_scatter.RECORD.itemsize == 16
    assert {k: v[1] for k, v in fields.items()} == {"x": 0, "y": 4, "rgb": 8, "kind": 11, "photo": 12, "token": 14}
    js = (ROOT / "attnviz_app" / "qk_scatter.js").read_text()
    assert "const RECORD = 16;" in js and "gl.UNSIGNED_BYTE, false, 11)" in js and "RECORD + 14, true)" in js


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_the_altair_fallbacks_show_data_is_in_the_pages_language(three, lang, monkeypatch):
    """Without WebGL the Dataset page draws the Altair chart; its Show data opened the code's column names
    (x, y, kind_label, value) in English on a Chinese page."""
    from attnviz import i18n
    from attnviz_app import dataset_qk

    monkeypatch.setattr(dataset_qk, "t", lambda key, **values: i18n.text(lang, key, **values))
    caps, qk = three
    values = qkmap.colour_values(qk, caps, "brightness")
    title = i18n.text(lang, "qkmap.colour_brightness")
    spec = dataset_qk.chart(qk, values, ["a.jpg", "b.jpg", "c.jpg"], title, False).to_dict()
    (rows,) = spec["datasets"].values()
    words = {k: i18n.text(lang, f"qkmap.{k}") for k in ("axis_1", "axis_2", "kind", "colour_photo", "token")}
    assert list(rows[0]) == [words["colour_photo"], words["token"], words["kind"], words["axis_1"], words["axis_2"],
                             title]
    got = np.array([[r[words["axis_1"]], r[words["axis_2"]], r[title]] for r in rows], dtype=np.float32)
    assert np.array_equal(got[:, :2], qk.xy.astype(np.float32))
    assert np.allclose(got[:, 2], values.astype(np.float32), equal_nan=True)
    assert {r[words["kind"]] for r in rows} == {i18n.text(lang, "qkmap.query"), i18n.text(lang, "qkmap.key")}
    # coloured by photo: no second photo column under the same name
    spec = dataset_qk.chart(qk, values, ["a.jpg", "b.jpg", "c.jpg"], words["colour_photo"], True).to_dict()
    (rows,) = spec["datasets"].values()
    assert len(rows[0]) == 5 and {r[words["colour_photo"]] for r in rows} == {"a.jpg", "b.jpg", "c.jpg"}
