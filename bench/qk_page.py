"""The page ``bench/qkmap.py`` serves: the Dataset page's Q/K chart of a map it saved (``QK_BENCH_DATA``)."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import streamlit as st

from attnviz_app.dataset_qk import chart


@st.cache_resource
def saved(path: str):
    return pickle.loads(Path(path).read_bytes())  # written by bench/qkmap.py itself, never by a visitor


qk, values, names = saved(os.environ["QK_BENCH_DATA"])
st.altair_chart(chart(qk, values, names, "Patch row", False), width="stretch")
