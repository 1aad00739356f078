"""Any token as the query: click a patch (or pick CLS / a register) and see its attention row."""
from __future__ import annotations

import re

import streamlit as st
from PIL import Image

from attnviz import render
from ..text import t

from .base import ALL, Context, View, patch_named, register
from .common import (
    clickable_picture, colour_scale, download_png, enlarge, head_label, head_part, mark_patch, patch_table,
    selected_points, token_label,
)

CHART_KEY = "query_chart"
PATCH = "patch"


def current_query(cap) -> int:
    """The query token chosen in this session (shared with the matrix view); CLS by default."""
    h, w = cap.grid
    kind = st.session_state.get("query_token", 0)
    if kind == PATCH:
        row, col = st.session_state.get("query_patch", (h // 2, w // 2))
        return cap.num_prefix_tokens + min(row, h - 1) * w + min(col, w - 1)
    return kind if isinstance(kind, int) and 0 <= kind < cap.num_prefix_tokens else 0


def picture_of(cap, view: Image.Image, layer: int, head, query: int, alpha: float, cmap: str,
               smooth: bool) -> Image.Image:
    """Token ``query``'s attention row over ``view``, enlarged, the query patch framed."""
    prefix, (h, w) = cap.num_prefix_tokens, cap.grid
    grid_map = cap.row(layer, head, query)[prefix:].reshape(h, w)
    picture = enlarge(render.overlay(view, grid_map, alpha=alpha, cmap=cmap, smooth=smooth))
    return picture if query < prefix else mark_patch(picture, cap.grid, divmod(query - prefix, w))


def set_query(prefix: int, grid: tuple[int, int], token: int) -> None:
    """Make ``token`` the session's query (a prefix token by index, a patch by grid position) for a capture with
    ``prefix`` prefix tokens on a ``grid`` of patches."""
    if token < prefix:
        st.session_state["query_token"] = token
    else:
        st.session_state["query_token"] = PATCH
        st.session_state["query_patch"] = divmod(token - prefix, grid[1])


def link_name(cap) -> str:
    """The session's query as a link names it: ``cls``, ``reg2`` or ``r3c11`` (row 3, column 11, 1-based)."""
    query, prefix = current_query(cap), cap.num_prefix_tokens
    if query < prefix:
        return f"reg{query}" if query else "cls"
    row, col = divmod(query - prefix, cap.grid[1])
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
    h, w = cap.grid
    prefix = cap.num_prefix_tokens
    options = [PATCH, *range(prefix)]
    if st.session_state.get("query_token") not in options:  # e.g. a register of a model no longer loaded
        st.session_state["query_token"] = 0
    query = current_query(cap)

    left, right = st.columns([3, 2], gap="large")
    with right:
        st.selectbox(
            t("analysis.query.token"), options, key="query_token", help=t("analysis.query.help"),
            placeholder=t("classroom.choose"),
            format_func=lambda o: t("analysis.query.patch_option") if o == PATCH else token_label(o, prefix, (h, w)),
        )
    query = current_query(cap)
    row = cap.row(ctx.layer, ctx.head, query)  # (N,)
    grid_map = row[prefix:].reshape(h, w)
    drawn = (ctx.layer, ctx.head, query, ctx.alpha, ctx.cmap, ctx.smooth)
    picture = picture_of(cap, ctx.view, *drawn)
    label = token_label(query, prefix, cap.grid)

    with left:
        title = t("analysis.query.title", layer=ctx.layer + 1, head=head_label(ctx.head), token=label)
        st.subheader(title)
        clickable_picture(picture, cap.grid, key=CHART_KEY, on_select=_clicked, narrow=ctx.narrow, name=title,
                          table=patch_table(grid_map, t("analysis.matrix.colorbar")))
        st.caption(t("analysis.query.caption"))
        colour_scale(grid_map, ctx.cmap, picture.width, t("analysis.query.units", n=cap.num_tokens))
        download_png(ctx.deferred(picture_of, *drawn), f"query{query}_layer{ctx.layer + 1}_head{head_part(ctx.head)}.png",
                     key="download_query")
    with right:
        st.subheader(t("analysis.query.prefix_header"))
        st.caption(t("analysis.query.prefix_body"))
        # a Markdown table wraps into a narrow column (a 1024 px laptop's); a data frame hid its numbers off the right
        st.markdown("\n".join([f"| {t('analysis.query.prefix_key')} | {t('analysis.matrix.colorbar')} |", "|---|---:|",
                               *(f"| {token_label(k, prefix, cap.grid)} | {row[k]:.4f} |" for k in range(prefix))]))
        st.markdown(t("analysis.query.self", weight=float(row[query])))


register(View("query", show, controls=ALL, order=20, reads_query=True))
