"""Any token as the query: click a patch (or pick CLS / a register) and see its attention row."""
from __future__ import annotations

import re

import streamlit as st
from PIL import Image

from attnviz import render
from ..text import t

from .base import ALL, Context, View, patch_named, register
from .common import (window_lines, 
    clickable_picture, colour_scale, download_png, enlarge, head_label, head_part, mark_patch, patch_table,
    selected_points, token_label,
)

CHART_KEY = "query_chart"
PATCH = "patch"


def asks(cap, layer: int, token: int) -> bool:
    """Whether ``token`` is a query at ``layer`` (CaiT's class attention: the class token alone asks)."""
    return bool((cap.layout(layer).windows == token).any())


def current_query(cap, layer: int) -> int:
    """The query token chosen in this session (shared with the matrix view) at ``layer``'s grid; CLS by default,
    else the first token that asks there."""
    lay = cap.layout(layer)
    (h, w), prefix = lay.grid, lay.prefix
    kind = st.session_state.get("query_token", 0)
    if kind == PATCH:
        row, col = st.session_state.get("query_patch", (h // 2, w // 2))
        token = prefix + min(row, h - 1) * w + min(col, w - 1)
    else:
        token = kind if isinstance(kind, int) and 0 <= kind < prefix else 0
    return token if asks(cap, layer, token) else int(lay.windows[0, 0])


def picture_of(cap, view: Image.Image, layer: int, head, query: int, alpha: float, cmap: str,
               smooth: bool) -> Image.Image:
    """Token ``query``'s attention row over ``view``, enlarged, the query patch framed and, where the layer has
    windows, the query's window outlined."""
    lay = cap.layout(layer)
    grid_map = cap.query_map(layer, head, query)  # (h, w) at the layer's keys' grid
    picture = enlarge(render.overlay(view, grid_map, alpha=alpha, cmap=cmap, smooth=smooth))
    if lay.num_windows > 1:
        picture = window_lines(picture, cap, layer, query)
    if query < lay.prefix or lay.keys_grid != lay.grid:  # a prefix token, or queries on another grid than the map
        return picture
    return mark_patch(picture, lay.grid, divmod(query - lay.prefix, lay.grid[1]))


def set_query(prefix: int, grid: tuple[int, int], token: int) -> None:
    """Make ``token`` the session's query (a prefix token by index, a patch by grid position) for a capture with
    ``prefix`` prefix tokens on a ``grid`` of patches."""
    if token < prefix:
        st.session_state["query_token"] = token
    else:
        st.session_state["query_token"] = PATCH
        st.session_state["query_patch"] = divmod(token - prefix, grid[1])


def link_name(cap, layer: int) -> str:
    """The session's query as a link names it: ``cls``, ``reg2`` or ``r3c11`` (row 3, column 11, 1-based)."""
    lay = cap.layout(layer)
    query, prefix = current_query(cap, layer), lay.prefix
    if query < prefix:
        return f"reg{query}" if query else "cls"
    row, col = divmod(query - prefix, lay.grid[1])
    return f"r{row + 1}c{col + 1}"


def follow_link(name: str) -> None:
    """Make the query the one a link names (:func:`link_name`'s words); anything else is left out. A patch past
    the model's grid is its last row or column (:func:`current_query`), a register it lacks the class token."""
    if name == "cls":
        st.session_state["query_token"] = 0
    elif found := re.fullmatch(r"reg([1-9][0-9]?)", name):
        st.session_state["query_token"] = int(found[1])
    elif patch := patch_named(name):
        st.session_state["query_token"], st.session_state["query_patch"] = PATCH, patch


def _clicked() -> None:
    points = selected_points(st.session_state.get(CHART_KEY), "patch")
    if points:
        st.session_state["query_patch"] = (int(points[0]["row"]), int(points[0]["col"]))
        st.session_state["query_token"] = PATCH


def show(ctx: Context) -> None:
    cap = ctx.cap
    lay = cap.layout(ctx.layer)
    (h, w), prefix, key_prefix = lay.grid, lay.prefix, lay.num_key_prefix
    options = [*([PATCH] if bool((lay.windows >= prefix).any()) else []),  # a patch, where patches ask
               *(k for k in range(prefix) if asks(cap, ctx.layer, k))]
    if st.session_state.get("query_token") not in options:  # e.g. a register of a model no longer loaded
        st.session_state["query_token"] = options[0] if 0 not in options else 0

    left, right = st.columns([3, 2], gap="large")
    with right:
        st.selectbox(
            t("analysis.query.token"), options, key="query_token", help=t("analysis.query.help"),
            placeholder=t("classroom.choose"),
            format_func=lambda o: t("analysis.query.patch_option") if o == PATCH else token_label(o, prefix, (h, w)),
        )
    query = current_query(cap, ctx.layer)
    row = cap.row(ctx.layer, ctx.head, query)  # (Nk,): every key, zero outside the query's window
    grid_map = cap.query_map(ctx.layer, ctx.head, query)  # (h, w) at the keys' grid
    drawn = (ctx.layer, ctx.head, query, ctx.alpha, ctx.cmap, ctx.smooth)
    picture = picture_of(cap, ctx.view, *drawn)
    label = token_label(query, prefix, lay.grid)

    with left:
        title = t("analysis.query.title", layer=ctx.layer + 1, head=head_label(ctx.head), token=label)
        st.subheader(title)
        clickable_picture(picture, lay.grid, key=CHART_KEY, on_select=_clicked, narrow=ctx.narrow, name=title,
                          table=patch_table(grid_map, t("analysis.matrix.colorbar")))
        if lay.num_windows > 1:  # the softmax runs over the query's window only
            st.caption(t("stages.query_caption", shifted=t("stages.query_shifted", sh=lay.shift[0], sw=lay.shift[1])
                         if any(lay.shift) else ""))
        else:
            st.caption(t("analysis.query.caption"))
        colour_scale(grid_map, ctx.cmap, picture.width, t("analysis.query.units", n=lay.keys.shape[1]))
        download_png(ctx.deferred(picture_of, *drawn), f"query{query}_layer{ctx.layer + 1}_head{head_part(ctx.head)}.png",
                     key="download_query")
    with right:
        if not key_prefix:  # no class token or registers among the keys: nothing off the map
            if lay.keys_grid == lay.grid:
                st.markdown(t("analysis.query.self", weight=float(row[query])))
            return
        st.subheader(t("analysis.query.prefix_header"))
        st.caption(t("analysis.query.prefix_body"))
        # a Markdown table wraps into a narrow column (a 1024 px laptop's); a data frame hid its numbers off the right
        st.markdown("\n".join([f"| {t('analysis.query.prefix_key')} | {t('analysis.matrix.colorbar')} |", "|---|---:|",
                               *(f"| {token_label(k, key_prefix, lay.keys_grid)} | {row[k]:.4f} |"
                                 for k in range(key_prefix))]))
        if lay.keys_grid == lay.grid and key_prefix == prefix:  # the query is one of the keys
            st.markdown(t("analysis.query.self", weight=float(row[query])))


register(View("query", show, controls=ALL, order=20, reads_query=True, beginner=True))
