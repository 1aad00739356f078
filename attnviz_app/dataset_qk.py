"""The Dataset page's Q/K map: one head's queries and keys over a run's photos, and the patch search.

Read from the run's stored captures (``attnviz dataset --store qk``), one head at a time
(:func:`attnviz.qkmap.run_captures`), so 200 photos are ~20 MB, not 1.4 GB.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import streamlit as st

from attnviz import qkmap, render
from attnviz.errors import RunError

from . import qk_scatter
from .text import t
from .views.common import CANVAS, described, mark_patch, token_label
from .views.qkmap import measured_sentence

COLOURS = ("photo", "row", "column", "cls_attention", "brightness")
MATCHES = 8
SCATTER_KEY = "dataset_qk_scatter"
CAPTURE_ENTRIES = 2  # heads kept read: each ≤ 200 photos' q, k and inputs (~110 MB at 196 px)


@st.cache_resource(show_spinner=False, max_entries=CAPTURE_ENTRIES)
def head_captures(out: str, _signature: tuple, signature_key: str, layer: int, head: int):
    # Shared by every session and never changed; keyed by the run's parts so a growing run is read again.
    return qkmap.run_captures(out, qkmap.MAX_PHOTOS, layer, head)


@st.cache_resource(show_spinner=False, max_entries=CAPTURE_ENTRIES * 2)
def head_map(out: str, signature_key: str, layer: int, head: int, normalize: str, _caps):
    qk = qkmap.qk_map(_caps, 0, 0, "pca", normalize)  # the captures hold only this head, as layer 0, head 0
    return qk, qkmap.statistics(qk)


def chart(qk: qkmap.QKMap, values: np.ndarray, names: list[str], colour_title: str, categorical: bool):
    """The map as an Altair chart: what a browser without WebGL gets (and ``bench/qkmap.py`` compares).

    Its columns are named in the page's language, so Show data opens a table a reader understands without
    a second copy of the 79 000 points under readable titles.
    """
    import altair as alt
    import pandas as pd

    labels = [token_label(int(i), qk.num_prefix_tokens, qk.grid) for i in range(qk.num_tokens)]
    x, y, kind, photo, token = (t(k) for k in ("qkmap.axis_1", "qkmap.axis_2", "qkmap.kind", "qkmap.colour_photo",
                                               "qkmap.token"))
    data = pd.DataFrame({
        photo: [names[i] for i in qk.photo], token: [labels[i] for i in qk.token],
        kind: np.where(qk.is_key, t("qkmap.key"), t("qkmap.query")),
        x: qk.xy[:, 0].astype(np.float32), y: qk.xy[:, 1].astype(np.float32),
    })
    if categorical:  # coloured by photo: that column is already there
        colour = alt.Color(field=photo, type="nominal", legend=None)
    else:
        data[colour_title] = values.astype(np.float32)
        colour = alt.Color(field=colour_title, type="quantitative", scale=alt.Scale(scheme="viridis"),
                           legend=alt.Legend(title=colour_title, orient="bottom"))
    shape = alt.Shape(field=kind, type="nominal", scale=alt.Scale(domain=[t("qkmap.query"), t("qkmap.key")],
                                                                  range=["circle", "square"]),
                      legend=alt.Legend(title=None, orient="top"))
    points = alt.Chart(data).mark_point(filled=True, size=10, opacity=0.6).encode(
        x=alt.X(field=x, type="quantitative", axis=alt.Axis(labels=False, ticks=False), scale=alt.Scale(zero=False)),
        y=alt.Y(field=y, type="quantitative", axis=alt.Axis(labels=False, ticks=False), scale=alt.Scale(zero=False)),
        color=colour, shape=shape,
        tooltip=[alt.Tooltip(field=photo, type="nominal"), alt.Tooltip(field=kind, type="nominal"),
                 alt.Tooltip(field=token, type="nominal")],
    ).properties(height=460, usermeta=CANVAS)
    return points.interactive()  # pan and zoom


def show(out: str, signature: tuple, layer: int, head: int) -> None:
    """The section, for head (``layer``, ``head``) counted from 1 as the page's boxes count."""
    st.subheader(t("qkmap.dataset_header", layer=layer, head=head))
    key = repr(signature)
    try:
        with st.spinner(t("qkmap.dataset_loading")):
            caps, paths = head_captures(out, signature, key, layer - 1, head - 1)
    except RunError:
        st.info(t("qkmap.dataset_no_store"), icon=":material/info:")
        return
    names = [Path(p).name for p in paths]
    c1, c2 = st.columns(2)
    colour = c1.selectbox(t("qkmap.colour_by"), COLOURS, key="dataset_qk_colour", placeholder=t("classroom.choose"),
                          format_func=lambda c: t(f"qkmap.colour_{c}"))
    normalize = c2.selectbox(t("qkmap.normalize"), qkmap.NORMALIZATIONS, key="dataset_qk_normalize",
                             placeholder=t("classroom.choose"), format_func=lambda m: t(f"qkmap.normalize_{m}"))
    with st.spinner(t("qkmap.working")):
        qk, stats = head_map(out, key, layer - 1, head - 1, normalize, caps)
        values = qkmap.colour_values(qk, caps, colour)
    if colour in ("row", "column"):
        values = values + 1
    title, categorical = t(f"qkmap.colour_{colour}"), colour == "photo"
    labels = [token_label(i, qk.num_prefix_tokens, qk.grid) for i in range(qk.num_tokens)]
    # ~79 000 points: WebGL (Vega's canvas takes seconds to draw them and half a second a pan step).
    qk_scatter.show(qk_scatter.payload(qk, values, names, labels, title, categorical, qk_scatter.words()), SCATTER_KEY,
                    lambda: st.altair_chart(described(chart(qk, values, names, title, categorical)), width="stretch"))
    st.caption(t("qkmap.dataset_caption", photos=len(caps), points=len(qk.token)))
    st.markdown(measured_sentence(stats, layer - 1, head - 1))

    # --- The patch search ---
    st.markdown(f"**{t('qkmap.search_header')}**")
    st.caption(t("qkmap.search_explain"))
    h, w = qk.grid
    a, b, c = st.columns([2, 1, 1])
    photo = a.selectbox(t("qkmap.search_photo"), range(len(caps)), format_func=names.__getitem__, key="dataset_qk_photo",
                        placeholder=t("classroom.choose"))
    row = b.number_input(t("analysis.row"), 1, h, (h + 1) // 2, key="dataset_qk_row")
    col = c.number_input(t("analysis.column"), 1, w, (w + 1) // 2, key="dataset_qk_col")
    photo = photo if isinstance(photo, int) and 0 <= photo < len(caps) else 0
    token = qk.num_prefix_tokens + (int(row) - 1) * w + (int(col) - 1)
    matches = qkmap.patch_search(caps, 0, 0, photo, token, MATCHES)
    if not matches:
        st.info(t("qkmap.search_alone"))
        return
    size = 200
    columns = st.columns(5)
    with columns[0]:
        picture = caps[photo].prepared.picture(caps[photo].input)
        st.image(mark_patch(render.enlarge(picture, size), qk.grid, (int(row) - 1, int(col) - 1)),
                 caption=t("qkmap.search_query", name=names[photo], patch=token_label(token, qk.num_prefix_tokens, qk.grid)))
    for i, match in enumerate(matches):
        if i and i % 4 == 0:
            columns = st.columns(5)
        with columns[i % 4 + 1]:
            cap = caps[match.photo]
            patch = divmod(match.token - qk.num_prefix_tokens, w)
            st.image(mark_patch(render.enlarge(cap.prepared.picture(cap.input), size), qk.grid, patch),
                     caption=t("qkmap.search_match", rank=i + 1, name=names[match.photo],
                               patch=token_label(match.token, qk.num_prefix_tokens, qk.grid), logit=match.logit))
