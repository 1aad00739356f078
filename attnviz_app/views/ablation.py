"""Switch heads off: the L × H grid of effects beside each head's attention statistic, and click-to-ablate
(attnviz.ablation)."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from attnviz import ablation, interventions, render
from .. import heavy
from ..text import t

from .base import COLOURS, Context, LAYER, OPACITY, SMOOTH, View, register
from .common import described, download_chart, enlarge, table_layer, tooltip_table

KIND = "ablation"
OFF = "ablation_off"  # the heads switched off in this session: sorted list of "layer-head" (0-based)
CLICKS = "ablation_clicks"  # bumps the grid's key, so the same cell can be clicked again


def head_key(layer: int, head: int) -> str:
    return f"{layer}-{head}"


def parse(key: str) -> tuple[int, int]:
    layer, head = key.split("-")
    return int(layer), int(head)


def _clicked() -> None:
    chart = st.session_state.get(f"ablation_grid_{st.session_state.get(CLICKS, 0)}")
    try:
        points = list(chart["selection"]["cell"] or [])
    except (KeyError, TypeError):
        points = []
    if not points:
        return
    key = head_key(int(points[0]["layer"]) - 1, int(points[0]["head"]) - 1)
    off = set(st.session_state.get(OFF, []))
    off ^= {key}  # a click switches that head off, or back on
    st.session_state[OFF] = sorted(off, key=parse)
    st.session_state[CLICKS] = st.session_state.get(CLICKS, 0) + 1


def grid_chart(values: np.ndarray, title: str, off: set[str], clickable: bool, scheme: str) -> alt.Chart:
    layers, heads = values.shape
    cells = pd.DataFrame([{"layer": l + 1, "head": h + 1, "value": float(values[l, h]),
                           "off": head_key(l, h) in off} for l in range(layers) for h in range(heads)
                          if np.isfinite(values[l, h])])  # a layer's own heads (a Swin's grow stage by stage)
    tooltip = [alt.Tooltip("layer:O", title=t("ablation_page.layer")), alt.Tooltip("head:O", title=t("ablation_page.head")),
               alt.Tooltip("value:Q", format=".4f", title=title)]
    chart = alt.Chart(cells).mark_rect(stroke="white").encode(
        x=alt.X("head:O", title=t("ablation_page.head"), axis=alt.Axis(labelAngle=0)),
        y=alt.Y("layer:O", title=t("ablation_page.layer")),
        color=alt.Color("value:Q", scale=alt.Scale(scheme=scheme), legend=alt.Legend(orient="bottom", title=None)),
        strokeWidth=alt.condition("datum.off", alt.value(3), alt.value(0.5)),
        tooltip=tooltip,
    )
    marks = alt.Chart(cells[cells["off"]]).mark_text(text="✕", fontSize=14, color="white").encode(
        x="head:O", y="layer:O")
    if clickable:
        chart = chart.add_params(alt.selection_point(name="cell", fields=["layer", "head"], on="click", clear=False))
    return alt.layer(table_layer(tooltip_table(cells, tooltip)), chart, marks).properties(width=alt.Step(max(12, min(42, 300 // heads))),
                                             height=alt.Step(max(8, min(24, 330 // layers))))


def measured_grid(ctx: Context) -> ablation.HeadAblation | None:
    model, cap, key = ctx.model, ctx.cap, ctx.cap_key
    args = ()
    slot = st.empty()
    if not heavy.cached(KIND, key, args):
        passes = (cap.num_heads * (cap.num_layers + 1) / 2 if interventions.refusal(model) is None
                  else sum(cap.heads(layer) for layer in range(cap.num_layers)))  # a pass per head switched off
        if not slot.button(t("ablation_page.run"), key="ablation_run", type="primary") and \
                st.session_state.get("ablation_asked") != key:
            st.caption(t("ablation_page.press", passes=passes))
            return None
        st.session_state["ablation_asked"] = key
    bar = heavy.progress(KIND, key, args)
    try:
        result = heavy.run(KIND, key, args, lambda: ablation.head_ablation(model, cap, progress=bar),
                           t("ablation_page.running"), bar=bar)
        slot.empty()
        return result
    except heavy.Cancelled:
        return None


def correlation_sentence(result: ablation.HeadAblation, statistic: str) -> str:
    tendency = result.tendency(statistic)
    if tendency == "none":
        return t("ablation_page.corr_none")
    rho = result.entropy_correlation if statistic == "entropy" else result.share_correlation
    said = t("ablation_page.correlation", statistic=t(f"ablation_page.corr_{statistic}"), rho=rho,
             n=result.effect.size)
    if tendency == "little":
        return said + " " + t("ablation_page.corr_little", rho=ablation.TENDENCY_RHO)
    return said + " " + t(f"ablation_page.corr_{statistic}_{tendency}")


def show(ctx: Context) -> None:
    model, cap = ctx.model, ctx.cap
    st.markdown(t("ablation_page.explain"))
    off_keys = [k for k in st.session_state.get(OFF, [])
                if parse(k)[0] < cap.num_layers and parse(k)[1] < cap.heads(parse(k)[0])]
    result = measured_grid(ctx)
    if result is not None:
        if result.measure == "probability":
            effect_title = t("ablation_page.effect_probability", label=result.target_label)
        else:
            effect_title = t("ablation_page.effect_cosine")
        # without a class token the statistics describe the attention each patch receives (head_statistics)
        suffix = "" if cap.summary == "cls" else "_received"
        label = lambda s: t(f"ablation_page.{s}{suffix}")  # noqa: E731
        statistic = st.radio(t("ablation_page.statistic"), ["entropy", "share"], key="ablation_statistic",
                             horizontal=True, format_func=label)
        values = result.entropy if statistic == "entropy" else result.top_share
        left, right = st.columns(2)
        with left:
            st.markdown(f"**{t('ablation_page.effect_title')}**")
            st.caption(effect_title)
            effect = grid_chart(result.effect, effect_title, set(off_keys), True, "reds")
            st.altair_chart(described(effect), key=f"ablation_grid_{st.session_state.get(CLICKS, 0)}", on_select=_clicked,
                            selection_mode="cell", width="content", alt=effect_title)
            download_chart(effect.properties(title=effect_title), "head_ablation_effect", key="ablation_effect")
        with right:
            st.markdown(f"**{t('ablation_page.statistic')}**")
            st.caption(label(statistic))
            chart = grid_chart(values, label(statistic), set(off_keys), False, "blues")
            st.altair_chart(described(chart), width="content", alt=label(statistic))
            download_chart(chart.properties(title=label(statistic)), f"head_{statistic}",
                           key="ablation_statistic")
        st.info(correlation_sentence(result, statistic))

    options = [head_key(l, h) for l in range(cap.num_layers) for h in range(cap.heads(l))]
    st.session_state[OFF] = off_keys
    chosen = st.multiselect(t("ablation_page.off"), options, key=OFF, help=t("ablation_page.off_help"),
                            placeholder=t("ablation_page.off_placeholder"),
                            format_func=lambda k: t("ablation_page.head_name", layer=parse(k)[0] + 1,
                                                    head=parse(k)[1] + 1))
    if not chosen:
        st.caption(t("ablation_page.none_off"))
        return
    off = [parse(k) for k in chosen]
    ablated = ablation.ablated_capture(model, cap, off)  # one forward pass
    before, after = cap.summary_map(ctx.layer, "mean"), ablated.summary_map(ctx.layer, "mean")
    pictures = st.columns(2)
    for column, grid_map, title in ((pictures[0], before, t("ablation_page.before")),
                                    (pictures[1], after, t("ablation_page.after", count=len(off)))):
        picture = enlarge(render.overlay(ctx.view, grid_map, ctx.alpha, ctx.cmap, ctx.smooth))
        column.markdown(f"**{title}**")
        column.image(picture, caption=t("ablation_page.map_caption", layer=ctx.layer + 1,
                                        lo=float(grid_map.min()), hi=float(grid_map.max())))
    if model.labels is None:
        cos = float(np.dot(ablated.output.double(), cap.output.double()) /
                    (ablated.output.double().norm() * cap.output.double().norm()))
        st.info(t("ablation_page.output_cosine", cos=cos))
    else:
        target = int(cap.output.argmax())
        p0 = float(cap.output.double().softmax(-1)[target])
        p1 = float(ablated.output.double().softmax(-1)[target])
        st.info(t("ablation_page.output_probability", label=model.labels[target], before=p0, after=p1,
                  top=model.labels[int(ablated.output.argmax())]))


def needs(ctx: Context) -> str | None:
    """Heads that can be switched off: a plain ViT's blocks run one at a time, or one linear output projection per
    layer where a head's slice can be zeroed."""
    if ablation.switch_refusal(ctx.model) is None:
        return None
    return t("ablation_page.not_switchable", model=ctx.model.public_name)


register(View("ablation", show, controls=frozenset({LAYER, OPACITY, COLOURS, SMOOTH}), order=94, needs=needs))
