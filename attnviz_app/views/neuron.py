"""The neuron view: pick a query and a key patch and see their weight built from q and k (attnviz.neuron)."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from attnviz import render
from attnviz.neuron import neuron_pair
from ..text import listed, t

from .base import COLOURS, Context, LAYER, OPACITY, SMOOTH, View, register
from .common import window_lines, described, clickable_picture, download_chart, enlarge, mark_patch, patch_table, selected_points, table_layer

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
    width = 230 if narrow else 640  # with its row names and colour scales, in a phone's 358 px column: not scaled down

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


def inside(mask: np.ndarray, cell: tuple[int, int]) -> tuple[int, int]:
    """``cell`` where ``mask`` (the query's window on the keys' grid) holds it, else the nearest cell that it does."""
    if mask[cell]:
        return cell
    cells = np.argwhere(mask)
    r, c = cells[np.argmin(((cells - np.array(cell)) ** 2).sum(1))]
    return int(r), int(c)


def show(ctx: Context) -> None:
    cap = ctx.cap
    lay = cap.layout(ctx.layer)
    (h, w), prefix = lay.grid, lay.prefix  # the queries' grid
    (kh, kw), key_prefix = lay.keys_grid, lay.num_key_prefix  # the keys' (pooled keys: coarser)
    st.markdown(t("neuron_page.explain"))
    controls = st.columns([1, 2])
    if st.session_state.get("neuron_head", 0) >= lay.num_heads:  # a head this layer lacks
        st.session_state["neuron_head"] = 0
    head = controls[0].selectbox(t("ablation_page.head"), list(range(lay.num_heads)), key="neuron_head",
                                 format_func=lambda i: f"{i + 1}", placeholder=t("classroom.choose"))
    patches_ask = bool((lay.windows >= prefix).any())
    from_cls = lay.class_row and (not patches_ask or controls[1].checkbox(
        t("neuron_page.query_token") + ": " + t("neuron_page.class_token"), key="neuron_from_cls"))
    qr, qc = st.session_state.get(QUERY, (h // 2, w // 2))
    qr, qc = min(qr, h - 1), min(qc, w - 1)
    query = 0 if from_cls else prefix + qr * w + qc
    window = cap.window_mask(ctx.layer, query)  # (kh, kw): the keys this query's softmax runs over
    kr, kc = st.session_state.get(KEY, (kh // 2, min(kw - 1, kw // 2 + 1)))
    chosen = (min(kr, kh - 1), min(kc, kw - 1))
    kr, kc = inside(window, chosen)
    key = key_prefix + kr * kw + kc

    row = cap.query_map(ctx.layer, head, query)  # (kh, kw): where this query looks, in this head
    left, right = st.columns(2)
    with left:
        title = (t("neuron_page.query_token") + ": " + t("neuron_page.class_token") if from_cls else
                 t("neuron_page.query_title", row=qr + 1, col=qc + 1))
        st.markdown(f"**{title}**")
        picture = enlarge(ctx.view)
        if not from_cls:
            picture = mark_patch(picture, lay.grid, (qr, qc))
        clickable_picture(picture, lay.grid, key="neuron_query_chart", on_select=_pick(QUERY, "neuron_query_chart"),
                          narrow=True, name=title)
    with right:
        title = t("neuron_page.key_title", row=kr + 1, col=kc + 1)
        st.markdown(f"**{title}**")
        picture = enlarge(render.overlay(ctx.view, row, ctx.alpha, ctx.cmap, ctx.smooth))
        if lay.num_windows > 1:
            picture = window_lines(picture, cap, ctx.layer, query)
        picture = mark_patch(picture, lay.keys_grid, (kr, kc))
        clickable_picture(picture, lay.keys_grid, key="neuron_key_chart", on_select=_pick(KEY, "neuron_key_chart"),
                          narrow=True, name=title, table=patch_table(row, t("analysis.matrix.colorbar")))
        if (kr, kc) != chosen:  # the key clicked lies outside the query's window: its weight is 0
            st.caption(t("neuron_page.key_moved", row=chosen[0] + 1, col=chosen[1] + 1, n=int(window.sum())))

    pair = neuron_pair(cap, ctx.layer, head, query, key)
    d = pair.q.shape[0]
    st.markdown(t("neuron_page.strip", layer=ctx.layer + 1, head=head + 1, d=d))
    strip = strip_chart(pair, ctx.narrow)
    st.altair_chart(described(strip))
    download_chart(strip.properties(title=t("neuron_page.strip", layer=ctx.layer + 1, head=head + 1, d=d)),
                   f"q_k_product_layer{ctx.layer + 1}_head{head + 1}_query{query}_key{key}", key="neuron_strip")
    st.markdown(t("neuron_page.steps", dot=pair.dot, d=d, scale=pair.scale, bias=pair.bias, logit=pair.logit,
                  n=pair.num_tokens, weight=pair.weight))
    captured = float(cap.row(ctx.layer, head, query)[key])  # the capture's own weight, from its softmax
    st.caption(t("neuron_page.check", i=query, j=key, weight=captured, diff=abs(captured - pair.weight)))
    if cap.bias[ctx.layer] is None:
        st.caption(t("neuron_page.no_bias"))
    if "RoPE" in getattr(ctx.model.adapter, "family", ""):
        st.caption(t("neuron_page.rope_note"))
    st.caption(t("neuron_page.lesson_link"))


def needs(ctx: Context) -> str | None:
    """One softmax of q · k per head: a layer that mixes its heads' logits (talking heads) or blends the softmax with
    positional weights has no single q · k behind a weight."""
    cap = ctx.cap
    if cap.plain_softmax(ctx.layer):
        return None
    kind = "talking_heads" if cap.mix and cap.mix[ctx.layer] is not None else "blend"
    plain = [layer + 1 for layer in range(cap.num_layers) if cap.plain_softmax(layer)]
    return t(f"neuron_page.not_plain_{kind}", layer=ctx.layer + 1,
             layers=listed(plain[:6]) + ("…" if len(plain) > 6 else "") if plain else "—")


register(View("neuron", show, controls=frozenset({LAYER, OPACITY, COLOURS, SMOOTH}), order=96, needs=needs))
