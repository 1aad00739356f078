"""The page ``bench/qkmap.py`` serves: the Dataset page's Q/K map of a map it saved (``QK_BENCH_DATA``), drawn
by the WebGL scatter (``?draw=webgl``, what the page uses) or by the Altair chart (``?draw=vega``, its fallback)."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import streamlit as st

from attnviz_app import qk_scatter
from attnviz_app.dataset_qk import chart
from attnviz_app.views.common import token_label


@st.cache_resource
def saved(path: str):
    return pickle.loads(Path(path).read_bytes())  # written by bench/qkmap.py itself, never by a visitor


qk, values, names = saved(os.environ["QK_BENCH_DATA"])
if st.query_params.get("draw") == "vega":
    st.altair_chart(chart(qk, values, names, "Patch row", False), width="stretch")
else:
    labels = [token_label(i, qk.num_prefix_tokens, qk.grid) for i in range(qk.num_tokens)]
    data = qk_scatter.payload(qk, values, names, labels, "Patch row", False, qk_scatter.words())
    qk_scatter.show(data, "bench_scatter", lambda: st.error("no WebGL in this browser"))
