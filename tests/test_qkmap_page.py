"""The Q/K map view through AppTest in both languages: its sentence from an independent recomputation, the
normalisation note's measured change, and a clicked query handed to the Query view."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from attnviz import i18n
from conftest import APP
from test_qkmap_browser import expected_numbers


def _qk_page(lang: str, method: str = "pca") -> AppTest:
    """The Q/K map view of layer 12, head 3, raw q and k (no normalisation), in ``lang``."""
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["lang"] = lang
    at.session_state["view"] = "qkmap"
    at.session_state["layer"] = 12
    at.session_state["head"] = 3
    at.session_state["qk_normalize"] = "none"
    at.session_state["qk_method"] = method
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_sentence_and_query_handover(lang, real_model):
    at = _qk_page(lang)
    rho, row_r, col_r = expected_numbers(real_model, 11, 2)
    text = "\n".join(m.value for m in at.markdown)
    assert f"{rho:+.2f}" in text
    best = "by_position" if max(row_r, col_r) >= 0.7 else "partly_position" if max(row_r, col_r) >= 0.4 else "not_position"
    axis = i18n.text(lang, "qkmap.axis_row" if row_r >= col_r else "qkmap.axis_column")
    assert i18n.text(lang, f"qkmap.{best}", row=row_r, col=col_r, axis=axis) in text
    assert i18n.text(lang, "qkmap.none_note") in [c.value for c in at.caption]
    assert i18n.text(lang, "qkmap.title", layer=12, head=3) in [h.value for h in at.subheader]
    flattened = {"en": "flattened from 64 numbers (d_k) to 2", "zh-TW": "從 64 個數字（d_k）降維成 2 個"}[lang]
    assert real_model.network.blocks[11].attn.head_dim == 64 and any(flattened in c.value for c in at.caption)

    if lang != "en":
        return  # AppTest's second run of the Chinese page trips over its own photo-source radio ('Sample photo')
    # What a click on the query point of token 20 does (views.qkmap._picked_point, which AppTest cannot click);
    # the Query view then shows that patch.
    at.session_state["query_token"], at.session_state["query_patch"] = "patch", divmod(20 - 1, 14)
    at.run()
    patch = i18n.text(lang, "analysis.patch", row=2, col=6)  # token 20 = patch 19 = (1, 5) 0-based on 14 × 14
    assert patch in "\n".join(m.value for m in at.markdown)  # "Pink lines: … the query of patch (row 2, column 6)"
    at.session_state["view"] = "query"
    at.run()
    assert not at.exception
    assert any(patch in h.value for h in at.subheader), [h.value for h in at.subheader]


def test_umap_on_the_page_when_installed(real_model, monkeypatch, own_shared_results):
    """The page's sentence is the UMAP map's, of the page's own capture. UMAP's ρ moved by up to 0.4 when q and k
    moved by 1e-7 (docs/qk-map.md), so it is recomputed from the very capture the page mapped; that capture is checked
    against a fresh one to 1e-5."""
    pytest.importorskip("umap", reason="UMAP needs umap-learn (pip install 'attnviz[qk]')")
    import numpy as np

    import attnviz
    from attnviz import qkmap
    from attnviz_app.settings import DEFAULT_PHOTO

    mapped = []
    plain = qkmap.qk_map
    monkeypatch.setattr(qkmap, "qk_map", lambda cap, *args: mapped.append((cap, args)) or plain(cap, *args))
    at = _qk_page("en", "umap")
    box = at.selectbox(key="qk_method")
    assert i18n.text("en", "qkmap.method_umap") in box.options and box.value == "umap"
    assert not at.warning  # no "needs the package" note
    page_cap, args = next((cap, args) for cap, args in mapped if args[2:3] == ("umap",))
    assert args == (11, 2, "umap", "none")

    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample(DEFAULT_PHOTO), real_model).image)
    np.testing.assert_allclose(page_cap.weights(11, 2), cap.weights(11, 2), atol=1e-5)
    umap_rho = qkmap.statistics(plain(page_cap, 11, 2, method="umap", normalize="none")).distance_rho
    pca_rho = qkmap.statistics(plain(page_cap, 11, 2, normalize="none")).distance_rho
    assert f"{umap_rho:+.2f}" != f"{pca_rho:+.2f}"  # else the sentence below could not tell them apart
    assert f"{umap_rho:+.2f}" in "\n".join(m.value for m in at.markdown)  # the sentence is the UMAP map's


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_missing_umap_says_how_to_get_it(lang, monkeypatch, real_model):
    from attnviz import qkmap

    monkeypatch.setattr(qkmap, "available", lambda method: method == "pca")  # as on a machine without umap-learn
    at = _qk_page(lang, "umap")
    assert [w.value for w in at.warning] == [i18n.text(lang, "qkmap.missing_umap")]
    assert "pip install 'attnviz[qk]'" in at.warning[0].value
    rho, _, _ = expected_numbers(real_model, 11, 2)  # and it shows the PCA map instead
    assert f"{rho:+.2f}" in "\n".join(m.value for m in at.markdown)


def test_a_map_whose_distances_run_against_attention_says_so(real_model):
    """The rocket photo, layer 1, head 1, as the page first draws it (PCA of AttentionViz-normalised q and k):
    farther pairs have the larger q·k (ρ ≈ +0.42). The sentence says so; it used to say "says little"."""
    import attnviz
    from attnviz import qkmap

    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample("rocket"), real_model).image)
    stats = qkmap.statistics(qkmap.qk_map(cap, 0, 0))
    assert stats.distance_rho >= 0.4 and stats.closeness == "against"
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["sample"] = "rocket"
    at.session_state["view"] = "qkmap"
    at.session_state["layer"] = 1
    at.session_state["head"] = 1
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    text = "\n".join(m.value for m in at.markdown)
    assert i18n.text("en", "qkmap.near_against", layer=1, head=1, rho=stats.distance_rho, pairs=stats.pairs) in text, text
