"""The neuron view: pick a query and a key patch and see their weight built from q and k (attnviz.neuron)."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from attnviz import render
from attnviz.neuron import neuron_pair
from ..text import t

from .base import COLOURS, Context, LAYER, OPACITY, SMOOTH, View, register
from .common import described, clickable_picture, download_chart, enlarge, mark_patch, patch_table, selected_points, table_layer

QUERY, KEY = "neuron_query", "neuron_key"  # (row, col) of the chosen patches


def _pick(name: str, chart: str):
    def on_select() -> None:
        points = selected_points(st.session_state.get(chart), "patch")
        if points:
            st.session_state[name] = (int(points[0]["row"]), int(points[0]["col"]))
    return on_select


def strip_chart(pair, narrow: bool) -> alt.Chart:
    rows = []
    for name, values in ((t("neuron_page.q"), pair.q), (t("neuron_page.k"), pair.k),
                         (t("neuron_page.product"), pair.product)):
        rows += [{"row": name, "dim": i + 1, "value": float(v)} for i, v in enumerate(values)]
    data = pd.DataFrame(rows)
    width = 340 if narrow else 640

    def one(name: str) -> alt.Chart:
        return alt.Chart(data[data["row"] == name]).mark_rect().encode(
            x=alt.X("dim:O", title=None, axis=alt.Axis(labels=False, ticks=False)),
            y=alt.Y("row:N", title=None),
            color=alt.Color("value:Q", scale=alt.Scale(scheme="redblue", domainMid=0, reverse=True),
                            legend=alt.Legend(orient="right", title=None, gradientLength=30)),
            tooltip=[alt.Tooltip("dim:O", title=t("neuron_page.dim")),
                     alt.Tooltip("value:Q", format=".4f", title=t("neuron_page.value"))],
        ).properties(width=width, height=26)

    names = [t("neuron_page.q"), t("neuron_page.k"), t("neuron_page.product")]
    table = pd.DataFrame({t("neuron_page.dim"): np.arange(1, len(pair.q) + 1), names[0]: pair.q, names[1]: pair.k,
                          names[2]: pair.product})
    first, *rest = (one(n) for n in names)
    return alt.vconcat(alt.layer(table_layer(table), first), *rest).resolve_scale(color="independent")


def show(ctx: Context) -> None:
    cap = ctx.cap
    h, w = cap.grid
    prefix = cap.num_prefix_tokens
    st.markdown(t("neuron_page.explain"))
    controls = st.columns([1, 2])
    head = controls[0].selectbox(t("ablation_page.head"), list(range(cap.num_heads)), key="neuron_head",
                                 format_func=lambda i: f"{i + 1}", placeholder=t("classroom.choose"))
    from_cls = cap.has_class_token and controls[1].checkbox(
        t("neuron_page.query_token") + ": " + t("neuron_page.class_token"), key="neuron_from_cls")
    qr, qc = st.session_state.get(QUERY, (h // 2, w // 2))
    kr, kc = st.session_state.get(KEY, (h // 2, min(w - 1, w // 2 + 1)))
    qr, qc, kr, kc = min(qr, h - 1), min(qc, w - 1), min(kr, h - 1), min(kc, w - 1)
    query = 0 if from_cls else prefix + qr * w + qc
    key = prefix + kr * w + kc

    row = cap.row(ctx.layer, head, query)[prefix:].reshape(h, w)  # where this query looks, in this head
    left, right = st.columns(2)
    with left:
        title = (t("neuron_page.query_token") + ": " + t("neuron_page.class_token") if from_cls else
                 t("neuron_page.query_title", row=qr + 1, col=qc + 1))
        st.markdown(f"**{title}**")
        picture = enlarge(ctx.view)
        if not from_cls:
            picture = mark_patch(picture, cap.grid, (qr, qc))
        clickable_picture(picture, cap.grid, key="neuron_query_chart", on_select=_pick(QUERY, "neuron_query_chart"),
                          narrow=True, name=title)
    with right:
        title = t("neuron_page.key_title", row=kr + 1, col=kc + 1)
        st.markdown(f"**{title}**")
        picture = mark_patch(enlarge(render.overlay(ctx.view, row, ctx.alpha, ctx.cmap, ctx.smooth)), cap.grid, (kr, kc))
        clickable_picture(picture, cap.grid, key="neuron_key_chart", on_select=_pick(KEY, "neuron_key_chart"),
                          narrow=True, name=title, table=patch_table(row, t("analysis.matrix.colorbar")))

    pair = neuron_pair(cap, ctx.layer, head, query, key)
    d = pair.q.shape[0]
    st.markdown(t("neuron_page.strip", layer=ctx.layer + 1, head=head + 1, d=d))
    strip = strip_chart(pair, ctx.narrow)
    st.altair_chart(described(strip))
    download_chart(strip.properties(title=t("neuron_page.strip", layer=ctx.layer + 1, head=head + 1, d=d)),
                   f"q_k_product_layer{ctx.layer + 1}_head{head + 1}_query{query}_key{key}", key="neuron_strip")
    st.markdown(t("neuron_page.steps", dot=pair.dot, d=d, scale=pair.scale, bias=pair.bias, logit=pair.logit,
                  n=pair.num_tokens, weight=pair.weight))
    captured = float(cap.weights(ctx.layer, head)[query, key])
    st.caption(t("neuron_page.check", i=query, j=key, weight=captured, diff=abs(captured - pair.weight)))
    if cap.bias[ctx.layer] is None:
        st.caption(t("neuron_page.no_bias"))
    if "RoPE" in getattr(ctx.model.adapter, "family", ""):
        st.caption(t("neuron_page.rope_note"))
    st.caption(t("neuron_page.lesson_link"))


register(View("neuron", show, controls=frozenset({LAYER, OPACITY, COLOURS, SMOOTH}), order=96))
