"""Stages and windows, block by block: Stage and Block instead of Layer, the grid of that stage, each window
outlined; the summary map (mean attention received within windows), one patch's row, or the layer's matrix in
window order (block-diagonal).

One of the View box's views, for every model (a plain ViT is one stage of global windows); a model with more
than one stage opens on it.
"""
from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz import render
from attnviz.softmax import HEAD_FUSIONS

from .. import links
from ..text import listed, t
from .common import (window_lines, clickable_picture, colour_scale, download_file, download_png, enlarge, figure_png, head_label,
                     head_part, mark_patch, patch_table, selected_points)
from .base import COLOURS, OPACITY, SMOOTH, Context, View, patch_named, register
from .takeaway import files

CHART_KEY = "stage_query_chart"
LINKED = ("stage", "block", "show")  # its own names in a link, beside head and query (attnviz_app/links.py)
SHOWN = ("summary", "query", "matrix")


def _clicked() -> None:
    points = selected_points(st.session_state.get(CHART_KEY), "patch")
    if points:
        st.session_state["stage_query"] = (int(points[0]["row"]), int(points[0]["col"]))


def _size(grid: tuple[int, int]) -> str:
    return f"{grid[0]} × {grid[1]}"


def intro(model, cap) -> str:
    """What this model's stages are, in a few measured facts: grids, windows, pooled keys, class attention."""
    stages, layouts = cap.stages, cap.layouts
    grids = listed(_size(cap.layout(s[0]).grid) for s in stages)
    text = [t("stages.intro" if len(stages) > 1 else "stages.intro_one", model=model.public_name,
              stages=len(stages), grids=grids)]
    windowed = [lay for lay in layouts if lay.num_windows > 1]
    if windowed:
        text.append(t("stages.intro_windows", windows=listed(sorted({_size(lay.window) for lay in windowed}))))
        if any(any(lay.shift) for lay in windowed):
            text.append(t("stages.intro_shifted"))
    pooled = [lay for lay in layouts if lay.keys_grid != lay.grid]
    if pooled:
        text.append(t("stages.intro_pooled", n=len(pooled), total=len(layouts),
                      grids=listed(sorted({_size(lay.keys_grid) for lay in pooled}))))
    classy = sum(lay.class_row for lay in layouts)
    if classy:
        text.append(t("stages.intro_class", n=classy, total=len(layouts)))
    if getattr(cap, "note", None):  # layers of the model that have no token map, and why
        text.append(t(cap.note))
    return " ".join(text)


def block_label(lay, n: int) -> str:
    if lay.class_row and lay.windows.numel() == 1:
        kind = t("stages.class_attention")
    elif any(lay.shift):
        kind = t("stages.shifted")
    elif lay.keys_grid != lay.grid:
        kind = t("stages.pooled", h=lay.keys_grid[0], w=lay.keys_grid[1])
    else:
        kind = ""
    return t("stages.block_option", n=n, shifted=kind)


MATRIX_PX = 784  # at most this many rows and columns drawn; more are max-pooled (a window's block stays visible)
MATRIX_CELLS = 2**24  # at most this many weights built for one matrix (64 MB): the first windows of a large grid


def pooled(weights: np.ndarray, side: int = MATRIX_PX) -> tuple[np.ndarray, int]:
    """``weights`` max-pooled by a whole factor k until both sides are at most ``side`` (zero stays zero)."""
    k = max(1, -(-max(weights.shape) // side))
    if k == 1:
        return weights, 1
    rows, cols = -(-weights.shape[0] // k) * k, -(-weights.shape[1] // k) * k
    padded = np.zeros((rows, cols), weights.dtype)
    padded[: weights.shape[0], : weights.shape[1]] = weights
    return padded.reshape(rows // k, k, cols // k, k).max(axis=(1, 3)), k


def matrix(cap, layer: int, head, cmap: str, names: dict, stage: int, block: int, width: int) -> None:
    """The layer's attention matrix with queries and keys in window order: block-diagonal where it has windows."""
    from matplotlib.figure import Figure

    lay = cap.layout(layer)
    count = cap.windows_that_fit(layer, MATRIX_CELLS)  # never the whole-image matrix of a large grid
    weights, k = pooled(cap.ordered_weights(layer, head, count))
    fig = Figure(figsize=(6.4, 5.6))
    ax = fig.subplots()
    rows, cols = weights.shape[0] * k, weights.shape[1] * k  # the axes count tokens, not pooled squares
    shown = ax.imshow(weights, cmap=cmap, vmin=0.0, vmax=float(weights.max()), interpolation="nearest",
                      extent=(0, cols, rows, 0), aspect="auto" if rows == 1 else "equal")
    ax.set_xlabel(t("stages.matrix_keys", n=lay.keys.unique().numel()))
    ax.set_ylabel(t("stages.matrix_queries", n=lay.windows.numel()))
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
    png = figure_png(fig)
    st.subheader(t("stages.matrix_title", **names))
    st.image(png, width=width)
    pooled_note = t("stages.matrix_pooled", k=k) if k > 1 else ""
    if lay.num_windows > 1:
        st.caption(t("stages.matrix_caption", w=lay.num_windows, tq=lay.windows.shape[1], tk=lay.keys.shape[1],
                     pooled=pooled_note))
        if count < lay.num_windows:
            st.caption(t("stages.matrix_first", n=count, w=lay.num_windows))
    else:
        st.caption(t("stages.matrix_caption_global", pooled=pooled_note))
    download_file(png, f"stage{stage + 1}_block{block + 1}_head{head_part(head)}_matrix.png", key="download_stage_matrix")


def summary_picture(cap, view, layer: int, head, alpha: float, cmap: str, smooth: bool):
    """``layer``'s summary map (the class token's row, or the attention each patch receives) over ``view``."""
    grid_map = cap.summary_map(layer, head)
    return window_lines(enlarge(render.overlay(view, grid_map, alpha=alpha, cmap=cmap, smooth=smooth)), cap, layer)


def query_picture(cap, view, layer: int, head, patch: tuple[int, int], alpha: float, cmap: str, smooth: bool):
    """The attention row of the query at ``patch`` (row, column of the layer's grid) over ``view``."""
    lay = cap.layout(layer)
    token = lay.prefix + patch[0] * lay.grid[1] + patch[1]
    picture = enlarge(render.overlay(view, cap.query_map(layer, head, token), alpha=alpha, cmap=cmap, smooth=smooth))
    return mark_patch(window_lines(picture, cap, layer, token), lay.grid, patch)


def _follow_link(state, stages) -> None:
    """The stage, block, head, what to show and query patch a link names (``?stage=2&block=1&head=3&show=query&query=r3c4``,
    counted from 1), where this model has them; read once, before the boxes are drawn."""
    asked = {name: links.asked(name) or "" for name in (*LINKED, "head", "query")}
    if asked["stage"].isdecimal() and 1 <= int(asked["stage"]) <= len(stages):
        state["stage"] = int(asked["stage"]) - 1
    stage = state.get("stage", len(stages) - 1)
    if asked["block"].isdecimal() and stage in range(len(stages)) and 1 <= int(asked["block"]) <= len(stages[stage]):
        state[f"stage_block_{stage}"] = int(asked["block"]) - 1
    if asked["head"] in HEAD_FUSIONS or (asked["head"].isdecimal() and 1 <= int(asked["head"]) <= 999):
        state["stage_head"] = asked["head"] if asked["head"] in HEAD_FUSIONS else int(asked["head"])
    if asked["show"] in SHOWN:
        state["stage_show"] = asked["show"]
    if patch := patch_named(asked["query"]):
        state["stage_query"] = patch


def show(ctx: Context) -> dict[str, str]:
    """The Stage view. It reads the display controls of ``ctx`` (opacity, colours, smoothing) and not its Layer and
    Head: each stage has its own Block and Head boxes here. Its downloads get the capture back when clicked.
    ``panel`` (the presenter view's side column) takes the Stage, Block, Head and Show boxes, as it takes Layer, Head
    and View on a ViT; what the stages are then goes under the picture, which keeps the projector's height.
    Returns the words a link to what it shows needs (``stage``, ``block``, ``head``, ``show``, ``query``, counted
    from 1), each where it is not what the view opens on."""
    model, cap, view, narrow, panel = ctx.model, ctx.cap, ctx.view, ctx.narrow, ctx.panel
    alpha, cmap, smooth = ctx.alpha, ctx.cmap, ctx.smooth
    stages = cap.stages
    state = st.session_state
    _follow_link(state, stages)
    if state.get("stage") not in range(len(stages)):  # first, or kept from a model with more stages
        state["stage"] = len(stages) - 1

    if not ctx.present:  # the presenter view keeps the projector's height for the picture: this is under it there
        st.info(intro(model, cap))
    if panel is not None:  # Stage; Block and Head side by side; Show: the join box's QR code stays on a 720 px screen
        first, second = panel.container(), panel.container()  # two rows: the join box's QR code stays on a 720 px screen
        stage_col, what_col = first.columns(2)
        block_col, head_col = second.columns(2)
    else:
        stage_col, block_col, head_col, what_col = st.columns([3, 2, 2, 3])
    stage_labels = [t("stages.stage_option", n=s + 1, h=cap.layout(stages[s][0]).grid[0], w=cap.layout(stages[s][0]).grid[1],
                      patch=cap.layout(stages[s][0]).patch) for s in range(len(stages))]  # the box keeps these, not cap
    stage = stage_col.selectbox(
        t("stages.stage"), list(range(len(stages))), key="stage",
        format_func=stage_labels.__getitem__, placeholder=t("classroom.choose"))
    blocks = stages[stage]
    # one Block box per stage: each stage keeps its own choice, and its labels (which blocks are shifted)
    # are never those of another stage's box
    key = f"stage_block_{stage}"
    if state.get(key) not in range(len(blocks)):  # first, or kept from another model
        state[key] = len(blocks) - 1
    labels = [block_label(cap.layout(blocks[b]), b + 1) for b in range(len(blocks))]  # the box keeps these, not cap
    block = block_col.selectbox(t("stages.block"), list(range(len(blocks))), key=key,
                                format_func=labels.__getitem__, placeholder=t("classroom.choose"))
    layer = blocks[block]
    lay = cap.layout(layer)
    heads = [*HEAD_FUSIONS, *range(1, lay.num_heads + 1)]
    if st.session_state.get("stage_head", "mean") not in heads:
        st.session_state["stage_head"] = "mean"
    picked = head_col.selectbox(
        t("view.head"), heads, key="stage_head", placeholder=t("classroom.choose"),
        format_func=lambda h: t(f"view.head_{h}") if isinstance(h, str) else t("view.head_n", n=h))
    head = picked if isinstance(picked, str) else picked - 1
    kind = cap.summary_kind(layer)
    show_label = lambda w: t("stages.summary_cls" if w == "summary" and kind == "cls" else f"stages.{w}")  # noqa: E731
    if panel is not None:  # the projector's side panel: a box beside Stage, not three radio buttons under it
        what = what_col.selectbox(t("stages.show"), SHOWN, key="stage_show", format_func=show_label,
                                  placeholder=t("classroom.choose"))
    else:
        what = what_col.radio(t("stages.show"), SHOWN, key="stage_show", horizontal=True, format_func=show_label)
    names = dict(stage=stage + 1, block=block + 1, head=head_label(head))
    width = 358 if narrow else 560
    only_class = lay.windows.numel() == 1 and lay.class_row  # class attention: the class token is the only query
    if what == "query" and only_class:
        st.info(t("stages.only_class_queries"))
        what = "summary"
    query = None  # the query patch shown, as a link names it
    if what == "matrix":
        matrix(cap, layer, head, cmap, names, stage, block, width)
    elif what == "summary":
        grid_map = cap.summary_map(layer, head)
        drawn = (layer, head, alpha, cmap, smooth)
        picture = summary_picture(cap, view, *drawn)
        if kind == "cls":
            st.subheader(t("stages.cls_title", **names))
            caption = t("stages.cls_caption", h=lay.keys_grid[0], w=lay.keys_grid[1])
            units, name = t("stages.units_cls", uniform=1 / lay.num_keys), "cls"
        else:
            st.subheader(t("stages.summary_title", **names))
            queries = lay.windows.shape[1]
            caption = (t("stages.summary_caption", t=queries, wh=lay.window[0], ww=lay.window[1]) if lay.num_windows > 1
                       else t("stages.summary_caption_global", t=queries))
            units, name = t("stages.units_summary", uniform=1 / lay.keys.shape[1]), "received"
        if ctx.present:  # the projector: as large as the screen's height allows, the long caption left out
            with st.container(key="present_heat"):  # classroom.PRESENT_CSS sizes it, as the class token's heatmap
                st.image(picture, width="stretch")
                colour_scale(grid_map, cmap, picture.width, units, stretch=True)
        else:
            st.image(picture, width=min(picture.width, width))
            st.caption(caption)
            colour_scale(grid_map, cmap, min(picture.width, width), units)
        download_png(ctx.deferred(summary_picture, *drawn),
                     f"stage{stage + 1}_block{block + 1}_head{head_part(head)}_{name}.png", key="download_stage")
    else:
        h, w = lay.grid  # the queries' grid; the map is drawn at the keys' grid
        row, col = st.session_state.get("stage_query", (h // 2, w // 2))
        row, col = min(row, h - 1), min(col, w - 1)
        token, query = lay.prefix + row * w + col, f"r{row + 1}c{col + 1}"
        grid_map = cap.query_map(layer, head, token)
        drawn = (layer, head, (row, col), alpha, cmap, smooth)
        picture = query_picture(cap, view, *drawn)
        title = t("stages.query_title", row=row + 1, col=col + 1, **names)
        st.subheader(title)
        clickable_picture(picture, lay.grid, key=CHART_KEY, on_select=_clicked, narrow=narrow, name=title,
                          table=patch_table(grid_map, t("analysis.matrix.colorbar")))  # at the keys' grid
        shifted = t("stages.query_shifted", sh=lay.shift[0], sw=lay.shift[1]) if any(lay.shift) else ""
        if lay.num_windows > 1:
            st.caption(t("stages.query_caption", shifted=shifted))
        else:
            st.caption(t("stages.query_caption_global"))
        if lay.keys_grid != lay.grid:
            st.caption(t("stages.query_pooled", h=lay.keys_grid[0], w=lay.keys_grid[1], qh=h, qw=w))
        colour_scale(grid_map, cmap, min(picture.width, width), t("stages.units_query", t=lay.keys.shape[1]))
        if lay.keys_grid == lay.grid:
            st.markdown(t("stages.self_weight", weight=float(grid_map[row, col]), top=float(np.max(grid_map))))
        else:
            st.markdown(t("stages.top_weight", top=float(np.max(grid_map))))
        download_png(ctx.deferred(query_picture, *drawn),
                     f"stage{stage + 1}_block{block + 1}_head{head_part(head)}_query{token}.png",
                     key="download_stage_query")
    if ctx.present:
        with st.expander(t("stages.about")):
            st.info(intro(model, cap))
    files(model, cap, "mean", alpha, cmap, ctx.later())  # every (stage, block) as the interactive page and the GIF
    said = {"stage": (stage, len(stages) - 1), "block": (block, len(blocks) - 1), "head": (picked, "mean"),
            "show": (what, SHOWN[0])}
    words = {name: str(value + 1 if name in ("stage", "block") else value)
             for name, (value, first) in said.items() if value != first}
    return words | ({"query": query} if query else {})


register(View("stages", show, controls=frozenset({OPACITY, COLOURS, SMOOTH}), order=45,
              no_layer_head="stages.no_layer_head"))
