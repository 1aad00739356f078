"""The class token's attention over the patches, laid on the photo; for a model without a class
token, the stated alternative (the mean attention each patch receives), labelled as such."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st
from PIL import Image

from attnviz import offline, render, runtimes, stats
from ..text import device_label, listed, t

from .base import ALL, Context, View, register
from .common import attending, window_lines, described, download_figure, download_png, enlarge, head_label, heatmap, table_layer, tooltip_table
from .norms import mark_high_norm, norm_sentence
from .takeaway import downloads as take_away


def no_class_token_note(cap, layer: int) -> None:
    """Say once, where a map would be the class token's, what is shown instead (inside windows, where it has them)."""
    if cap.summary_kind(layer) != "cls":
        lay = cap.layout(layer)
        if lay.num_windows > 1:
            st.info(t("families.no_cls_note_windows", t=lay.windows.shape[1], wh=lay.window[0], ww=lay.window[1]))
        else:
            h, w = lay.keys_grid
            st.info(t("families.no_cls_note", p=h * w))


def spread_sentence(grid_map) -> str | None:
    """Whether the map shown is diffuse or concentrated, from its own numbers (:func:`attnviz.stats.concentration`);
    None for a map with no weight to share."""
    if not grid_map.sum() > 0:
        return None
    c = stats.concentration(grid_map)
    return t("view.reading_diffuse" if c.diffuse else "view.reading_focused", top_cells=c.top_cells, cells=c.cells,
             top=c.top, even=c.even, limit=stats.DIFFUSE_BELOW)


def picture_of(cap, view: Image.Image, layer: int, head, alpha: float, cmap: str, smooth: bool) -> Image.Image:
    """The heatmap of ``layer`` and ``head`` over ``view``, enlarged, with its high-norm patches marked and, where
    the layer attends inside windows, each window outlined."""
    grid_map = cap.summary_map(layer, head)  # (h, w) at the layer's keys' grid: the CLS row, or the mean received
    picture = enlarge(render.overlay(view, grid_map, alpha=alpha, cmap=cmap, smooth=smooth))
    return window_lines(mark_high_norm(picture, cap, layer), cap, layer)


def show(ctx: Context) -> None:
    cap = ctx.cap
    drawn = (ctx.layer, ctx.head, ctx.alpha, ctx.cmap, ctx.smooth)
    grid_map = cap.summary_map(ctx.layer, ctx.head)
    picture = picture_of(cap, ctx.view, *drawn)
    lay = cap.layout(ctx.layer)
    (h, w), patches = lay.keys_grid, lay.keys_grid[0] * lay.keys_grid[1]
    has_row = cap.summary_kind(ctx.layer) == "cls"
    if has_row:
        title = t("view.title", layer=ctx.layer + 1, head=head_label(ctx.head))
        caption = t("view.caption", h=h, w=w)
    elif lay.num_windows > 1:  # the mean each patch receives from the queries of its window
        title = t("families.no_cls_title", layer=ctx.layer + 1, head=head_label(ctx.head))
        caption = t("stages.summary_caption", t=lay.windows.shape[1], wh=lay.window[0], ww=lay.window[1])
    else:
        title = t("families.no_cls_title", layer=ctx.layer + 1, head=head_label(ctx.head))
        caption = t("families.no_cls_caption", h=h, w=w, p=patches)
    if ctx.present:  # the projector: the picture as large as the screen allows, the facts left out
        st.subheader(title)
        with st.container(key="present_heat"):  # classroom.PRESENT_CSS sizes it by the screen's height
            heatmap(picture, grid_map, ctx.cmap, caption, present=True)
        return
    left, right = st.columns([3, 2], gap="large")
    with left:
        no_class_token_note(cap, ctx.layer)
        st.subheader(title)
        heatmap(picture, grid_map, ctx.cmap, caption)
        with st.expander(t("view.reading")):
            if cap.summary == "cls":  # the class token asks at every layer: its spread, layer by layer
                spread = stats.class_token_spread(cap)  # measured here, not what models often do
                heads = spread.heads[ctx.layer]
                reading = t("view.reading_body", n=cap.num_tokens, uniform=1 / cap.num_tokens,
                            focused=spread.focused_layer + 1, spread=spread.spread_layer + 1,
                            fe=spread.mean_map[spread.focused_layer], se=spread.mean_map[spread.spread_layer],
                            max=spread.max_entropy, layer=ctx.layer + 1, lo=heads.min(), hi=heads.max())
            elif has_row:  # it asks here, not at every layer (CaiT's class attention)
                reading = t("view.reading_layer", layer=ctx.layer + 1, n=lay.num_keys, uniform=1 / lay.num_keys)
            elif lay.num_windows > 1:
                keys = lay.keys.shape[1]
                reading = t("families.no_cls_reading_windows", t=lay.windows.shape[1], uniform=1 / keys)
            else:
                reading = t("families.no_cls_reading_body", p=patches, uniform=1 / patches)
            for sentence in (spread_sentence(grid_map), norm_sentence(cap, ctx.layer)):  # what this capture shows
                if sentence:
                    reading = reading.rstrip() + "\n- " + sentence
            st.markdown(reading)
        head_part = ctx.head if isinstance(ctx.head, str) else ctx.head + 1
        download_png(ctx.deferred(picture_of, *drawn), f"attention_layer{ctx.layer + 1}_head{head_part}.png",
                     key="download_cls")
        download_figure(ctx, ("cls",), (ctx.layer,), (ctx.head,), f"attention_layer{ctx.layer + 1}_head{head_part}",
                        key="download_cls_figure")
        take_away(ctx)  # the interactive page and the layer sweep (views/takeaway.py)
    with right:
        if ctx.beginner:  # the model in one line; the rest is for the research page
            h, w = cap.grid
            st.caption(t("facts.line", name=ctx.model.public_name, h=h, w=w, n=cap.num_tokens))
        else:
            facts(ctx)


def engine(model) -> str:
    """What computed the capture: PyTorch, or the runtime the owner switched on (checked exact at load)."""
    if model.runtime is None:
        return t("facts.engine_pytorch")
    return t("facts.engine_runtime", runtime=runtimes.RUNTIMES[model.runtime.name].LABEL)


def facts(ctx: Context) -> None:
    cap, model = ctx.cap, ctx.model
    h, w = cap.grid
    st.subheader(t("facts.header"))
    # the offline default's origin in the reader's language; other origins are names (never a server path)
    provenance = t("facts.offline_provenance") if model.provenance == offline.PROVENANCE else model.provenance
    if cap.uniform:  # one grid of N tokens and one head count throughout
        st.markdown(t(
            "facts.body", name=model.public_name, provenance=provenance, size=model.size, h=h, w=w,
            prefix=cap.num_prefix_tokens, patches=h * w, n=cap.num_tokens, layers=cap.num_layers,
            heads=cap.num_heads, head_dim=model.head_dim, dim=model.embed_dim, ms=cap.seconds * 1000,
            device=device_label(model.device), engine=engine(model),
        ))
    else:  # each stage its own grid and heads: say them, and the chosen layer's
        firsts, lay = [cap.layout(s[0]) for s in cap.stages], cap.layout(ctx.layer)
        st.markdown(t(
            "facts.body_stages", name=model.public_name, provenance=provenance, size=model.size, h=h, w=w,
            patches=h * w, stages=len(cap.stages), grids=listed(f"{l.grid[0]} × {l.grid[1]}" for l in firsts),
            layers=cap.num_layers, heads=listed(dict.fromkeys(str(lay.num_heads) for lay in cap.layouts)),
            layer=ctx.layer + 1, stage=lay.stage + 1, block=lay.block + 1, lh=lay.grid[0], lw=lay.grid[1],
            windows=attending(lay), ms=cap.seconds * 1000,
            device=device_label(model.device), engine=engine(model),
        ))
    top = model.top_classes(cap.output)
    if not top:
        st.info(t("facts.no_classes"))
        return
    # a cats-vs-dogs classifier has 2 classes: all of them, not "top 5"
    st.subheader(t("facts.top5") if len(model.labels) > len(top) else t("facts.all_classes", k=len(top)))
    table = pd.DataFrame({"class": [c for c, _ in top], "probability": [p for _, p in top]})
    tooltip = [alt.Tooltip("class:N", title=t("facts.class")),
               alt.Tooltip("probability:Q", format=".3f", title=t("facts.probability"))]
    bars = alt.Chart(table).mark_bar().encode(
        x=alt.X("probability:Q", scale=alt.Scale(domain=[0, 1]), title=t("facts.probability")),
        y=alt.Y("class:N", sort="-x", title=None), tooltip=tooltip,
    )
    st.altair_chart(described(alt.layer(table_layer(tooltip_table(table, tooltip)), bars)), width="stretch")


register(View("cls", show, controls=ALL, order=10, beginner=True))
