"""The interactive page's data for models with stages (attnviz/html_stages.py): per layer its own grid,
window rows that decode to the library's query maps, class-attention blocks without clicks, and the
byte budget. The page itself in a browser: tests/test_stages_page.py."""
from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import attnviz
from attnviz import html
from conftest import ASSETS
from test_stages_page import page_arrays
from tests.test_zoo import SMALL_CAIT, SMALL_LEVIT


def small_capture(name: str, kwargs: dict, size: int):
    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    return attnviz.capture(attnviz.wrap(network, name, "random init", size), Image.open(ASSETS / "cat.jpg"))


def decoded_row(arrays: dict, layer: int, k: int, query: int, key_prefix: int, cells: int) -> tuple[np.ndarray, float]:
    """(P,) the page's map for query token ``query`` (as its script lays it on the keys' grid), and its ±."""
    windows, keys = arrays[f"windows.{layer}"], arrays[f"keys.{layer}"]
    w, t = divmod(int(np.flatnonzero(windows.reshape(-1) == query)[0]), windows.shape[1])
    lo, hi = arrays[f"rows_lo.{layer}"][k, w, t], arrays[f"rows_hi.{layer}"][k, w, t]
    shown = np.full(cells, lo, np.float64)  # level 0 outside the window: lo is 0 where the window does not cover the grid
    on_grid = keys[w] >= key_prefix
    shown[keys[w][on_grid] - key_prefix] = lo + arrays[f"rows.{layer}"][k, w, t][on_grid] / 255 * (hi - lo)
    return shown, (hi - lo) / 510


def test_pooled_keys_rows_decode_to_the_query_map_at_the_keys_grid():
    """LeViT's subsampling block: queries 4 × 4, keys 7 × 7; a query's row is drawn at the keys' grid."""
    cap = small_capture("levit_128s", SMALL_LEVIT, 112)
    meta, arrays = page_arrays(html.page(cap, "en"))
    layer = next(i for i, m in enumerate(meta["staged"]) if m["grid"] != m["keys"])
    lay = cap.layout(layer)
    assert meta["staged"][layer]["grid"] == [4, 4] and meta["staged"][layer]["keys"] == [7, 7]
    for k, head in enumerate(["mean", "max", "min", 0]):
        for query in (lay.prefix, lay.prefix + 5, lay.num_tokens - 1):
            shown, tol = decoded_row(arrays, layer, k, query, lay.num_key_prefix, 49)
            np.testing.assert_allclose(shown, cap.query_map(layer, head, query).reshape(-1), atol=tol * (1 + 1e-5) + 1e-9)


def test_class_attention_blocks_offer_no_clicks_and_say_so():
    cap = small_capture("cait_xxs24_224", SMALL_CAIT, 64)
    doc = html.page(cap, "zh-TW")
    meta, arrays = page_arrays(doc)
    assert [m["patchQueries"] for m in meta["staged"]] == [True, True, False, False]
    assert [m["summary"] for m in meta["staged"]] == ["mean_received", "mean_received", "cls", "cls"]
    assert "rows.0" in arrays and "rows.2" not in arrays and "rows.3" not in arrays
    assert "此區塊只有類別 token 是查詢" in doc and "階段 2、區塊 2" in doc  # the sentence and the control, in Chinese
    k = 0  # mean of heads: the class token's row is the summary of a class-attention block
    lo, hi = arrays["summary_lo.3"][k], arrays["summary_hi.3"][k]
    np.testing.assert_allclose(lo + arrays["summary.3"][k] / 255 * (hi - lo), cap.cls_map(3, "mean").reshape(-1),
                               atol=(hi - lo) / 510 * (1 + 1e-5) + 1e-9)


def test_rows_only_while_they_fit_the_budget(monkeypatch):
    cap = small_capture("swin_tiny_patch4_window7_224", {"img_size": 112, "depths": (2, 2), "embed_dim": 32,
                                                         "num_heads": (2, 4)}, 112)
    # K · W · Tq · Tk per layer: stage 1 (2 heads) 5 · 784 · 49, stage 2 (4 heads) 7 · 196 · 49, two blocks each
    assert html.all_rows_bytes(cap) == 2 * (5 * 784 * 49 + 7 * 196 * 49)
    meta, arrays = page_arrays(html.page(cap, "en"))
    assert meta["allRows"] and all(m["rows"] for m in meta["staged"])
    monkeypatch.setattr(html, "ALL_ROWS_BYTES", html.all_rows_bytes(cap) - 1)
    doc = html.page(cap, "en")
    meta, arrays = page_arrays(doc)
    assert not meta["allRows"] and not any(m["rows"] for m in meta["staged"])
    assert not any(name.startswith("rows") for name in arrays) and "summary.3" in arrays
    assert "so it holds only each block" in doc
    assert html.estimated_mb(cap) == pytest.approx(len(doc) / 1e6, rel=0.5)


def test_a_staged_capture_in_a_notebook_is_the_page_in_an_iframe():
    cap = small_capture("levit_128s", SMALL_LEVIT, 112)
    shown = cap._repr_html_()
    assert shown.startswith("<iframe srcdoc=") and "Stage 2, block 2" in shown and len(repr(cap).splitlines()) == 1
