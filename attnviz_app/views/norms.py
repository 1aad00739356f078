"""Token norms by layer (Darcet et al. 2024, "Vision Transformers Need Registers"), and the
high-norm marks and sentences the class-token view uses.

The capture keeps every token's L2 norm after every layer (``Capture.token_norms``, (N,) per layer); a patch
is high-norm when its norm exceeds ``HIGH_NORM_RATIO`` × the median patch norm of that layer.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st
from PIL import Image

from attnviz import render
from attnviz.capture import HIGH_NORM_RATIO, Capture
from ..text import listed, t

from .base import COLOURS, Context, LAYER, OPACITY, SMOOTH, View, register
from .common import described, colour_scale, download_chart, enlarge, patch_table, table_layer, token_label

HIGH_NORM_COLOUR = (255, 0, 255)  # magenta: apart from the cyan query frame and every colour map's ends


def mark_high_norm(picture: Image.Image, cap: Capture, layer: int) -> Image.Image:
    """``picture`` (the enlarged overlay) with a magenta frame round each high-norm patch after ``layer``."""
    if not cap.token_norms:
        return picture
    if layer not in cap.norm_layers():  # the tokens after this layer are not its grid's cells
        return picture
    high = cap.high_norm(layer)
    cells = [(int(r), int(c), HIGH_NORM_COLOUR) for r, c in np.argwhere(high)]
    if not cells:
        return picture
    grid = cap.layout(layer).grid
    width = max(2, round(min(picture.height / grid[0], picture.width / grid[1]) / 10))
    return render.outline(picture, grid, cells, width)


def norm_sentence(cap: Capture, layer: int) -> str | None:
    """What this capture shows about high-norm tokens, for the reading notes of a map of ``layer``."""
    if not cap.token_norms or layer not in cap.norm_layers():
        return None
    ratios = cap.norm_ratio(layer)
    if (ratios > HIGH_NORM_RATIO).any():
        return t("families.high_norm_here", count=int((ratios > HIGH_NORM_RATIO).sum()), layer=layer + 1,
                 ratio=HIGH_NORM_RATIO, top=float(ratios.max()))
    layers = cap.high_norm_layers()
    if layers:
        return t("families.high_norm_elsewhere", layer=layer + 1, top=float(ratios.max()), ratio=HIGH_NORM_RATIO,
                 layers=listed(i + 1 for i in layers))
    layers = cap.norm_layers()
    tops = [float(cap.norm_ratio(i).max()) for i in layers]
    worst = layers[int(np.argmax(tops))]
    return t("families.high_norm_none", ratio=HIGH_NORM_RATIO, top=max(tops), layer=worst + 1)


def by_layer(cap: Capture) -> pd.DataFrame:
    """Long form: per layer (1-based), the largest patch norm and the 99th percentile, ÷ the median."""
    rows = []
    for layer in cap.norm_layers():
        ratios = cap.norm_ratio(layer).ravel()
        rows.append({"layer": layer + 1, "series": t("families.norms_max"), "ratio": float(ratios.max())})
        rows.append({"layer": layer + 1, "series": t("families.norms_p99"), "ratio": float(np.percentile(ratios, 99))})
    return pd.DataFrame(rows)


def show(ctx: Context) -> None:
    cap = ctx.cap
    if not cap.token_norms:
        st.info(t("families.norms_unavailable"))
        return
    layers = cap.norm_layers()
    ratios = [float(cap.norm_ratio(layer).max()) for layer in layers]  # this capture's longest patch
    top = layers[int(np.argmax(ratios))]
    st.markdown(t("families.norms_explain", ratio=HIGH_NORM_RATIO, top=max(ratios), layer=top + 1))
    data = by_layer(cap)
    x = alt.X("layer:Q", title=t("families.norms_layer_axis"), axis=alt.Axis(tickMinStep=1, format="d"),
              scale=alt.Scale(domain=[0.5, cap.num_layers + 0.5], nice=False))
    lines = alt.Chart(data).mark_line(point=True).encode(
        x=x, y=alt.Y("ratio:Q", title=t("families.norms_ratio_axis")),
        color=alt.Color("series:N", title=None, legend=alt.Legend(orient="top"),
                        sort=[t("families.norms_max"), t("families.norms_p99")]),
        tooltip=[alt.Tooltip("layer:Q", title=t("families.norms_layer_axis")),
                 alt.Tooltip("series:N", title=t("families.norms_curve")),
                 alt.Tooltip("ratio:Q", format=".2f", title=t("families.norms_ratio_axis"))],
    )
    rule = pd.DataFrame([{"y": HIGH_NORM_RATIO, "label": t("families.norms_threshold", ratio=HIGH_NORM_RATIO)}])
    threshold = alt.Chart(rule).mark_rule(strokeDash=[6, 4], color="gray").encode(y="y:Q")
    label = alt.Chart(rule).mark_text(align="left", dx=4, dy=-7, color="gray").encode(y="y:Q", x=alt.value(0), text="label:N")
    st.markdown(f"**{t('families.norms_by_layer')}**")
    wide = data.pivot(index="layer", columns="series", values="ratio").reset_index()
    shown = wide[["layer", t("families.norms_max"), t("families.norms_p99")]].rename(
        columns={"layer": t("families.norms_layer_axis")})
    chart = alt.layer(table_layer(shown), lines, threshold, label).properties(height=240)
    st.altair_chart(described(chart), width="stretch")
    download_chart(chart.properties(title=t("families.norms_by_layer")), "token_norms_by_layer", key="norms_by_layer")

    layer = ctx.layer
    ratios = cap.norm_ratio(layer)  # (h, w)
    st.subheader(t("families.norms_title", layer=layer + 1))
    # a phone, even turned sideways (844 px): one column; the histogram's 170 px beside the map cut its buttons' labels
    left, right = (st.container(), st.container()) if ctx.narrow else st.columns([3, 2], gap="large")
    with left:
        picture = enlarge(render.overlay(ctx.view, ratios, alpha=ctx.alpha, cmap=ctx.cmap, smooth=ctx.smooth))
        picture = mark_high_norm(picture, cap, layer)
        st.image(picture, caption=t("families.norms_map_caption", layer=layer + 1))
        colour_scale(ratios, ctx.cmap, picture.width, "×")
    with right:
        high = int((ratios > HIGH_NORM_RATIO).sum())
        if high:
            st.markdown(t("families.norms_found", layer=layer + 1, count=high, patches=ratios.size))
        else:
            st.markdown(t("families.norms_none", layer=layer + 1, top=float(ratios.max())))
        lay = cap.layout(layer)
        p = cap.token_norms[layer].numel() - lay.grid[0] * lay.grid[1]  # the prefix tokens among this layer's outputs
        if p:
            median = float(cap.token_norms[layer][p:].median())
            values = listed(
                f"{token_label(i, p, lay.grid, short=True)} {float(cap.token_norms[layer][i]) / median:.2f}×" for i in range(p)
            )
            st.caption(t("families.norms_prefix", layer=layer + 1, values=values))
        per_patch = cap.token_norms[layer][p:].double().cpu().numpy()
        norms = pd.DataFrame({"norm": per_patch})
        st.markdown(f"**{t('families.norms_histogram', layer=layer + 1)}**")
        histogram = alt.Chart(norms).mark_bar().encode(
            x=alt.X("norm:Q", bin=alt.Bin(maxbins=40), title=t("families.norms_norm_axis")),
            y=alt.Y("count():Q", title=t("families.norms_count_axis")),
        )
        histogram = alt.layer(table_layer(patch_table(per_patch.reshape(lay.grid), t("families.norms_norm_axis"))),
                              histogram).properties(height=220)
        st.altair_chart(described(histogram), width="stretch")
        download_chart(histogram.properties(title=t("families.norms_histogram", layer=layer + 1)),
                       f"token_norms_layer{layer + 1}_histogram", key="norms_histogram")


def needs(ctx: Context) -> str | None:
    """Token norms after the chosen layer, laid on its grid."""
    cap = ctx.cap
    if not cap.token_norms:
        return None  # show() says the capture has none
    if ctx.layer in (layers := cap.norm_layers()):
        return None
    return t("families.norms_not_grid", layer=ctx.layer + 1,
             layers=listed(i + 1 for i in layers[:6]) + ("…" if len(layers) > 6 else "") if layers else "—")


register(View("norms", show, controls=frozenset({LAYER, OPACITY, COLOURS, SMOOTH}), order=90,  # per layer, not per head
              needs=needs))
