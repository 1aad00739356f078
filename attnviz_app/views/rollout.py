"""Attention rollout next to the raw attention of the last rolled-out layer."""
from __future__ import annotations

import numpy as np
import streamlit as st
from PIL import Image

from attnviz import render
from attnviz.softmax import HEAD_FUSIONS
from attnviz.rollout import rollout_layers, rollout_map, rollout_refusal
from .. import heavy
from ..text import t

from .base import COLOURS, Context, Linked, OPACITY, SMOOTH, View, number, one_of, register, write_number
from .cls import no_class_token_note
from .common import colour_scale, download_figure, download_png, enlarge


def _layer_range(words: str) -> tuple[int, int] | None:
    """A link's ``4-12``: layers 4 to 12 (checked against the model as the view opens)."""
    first, _, last = words.partition("-")
    if first.isdecimal() and last.isdecimal() and 1 <= int(first) <= int(last) <= 999:
        return int(first), int(last)
    return None


LINKED = (
    Linked("layers", "rollout_layers", _layer_range, lambda ctx: tuple(i + 1 for i in rollout_layers(ctx.cap)),
           lambda layers: f"{layers[0]}-{layers[1]}", fits=lambda layers, ctx: layers[1] <= ctx.cap.num_layers),
    Linked("fusion", "rollout_fusion", one_of(HEAD_FUSIONS), lambda ctx: HEAD_FUSIONS[0]),
    Linked("discard", "rollout_discard", number(0.0, 0.95, 0.05), lambda ctx: 0.0, write_number),
)


def side_by_side(left: Image.Image, right: Image.Image, gap: int = 12) -> Image.Image:
    sheet = Image.new("RGB", (left.width + gap + right.width, max(left.height, right.height)), "white")
    sheet.paste(left, (0, 0))
    sheet.paste(right, (left.width + gap, 0))
    return sheet


def pictures_of(cap, view: Image.Image, last: int, fusion: str, rolled: np.ndarray, alpha: float, cmap: str,
                smooth: bool) -> list[Image.Image]:
    """Layer ``last``'s attention (heads fused by ``fusion``) and the ``rolled`` map, each over ``view``, enlarged."""
    raw = cap.summary_map(last - 1, fusion)
    return [enlarge(render.overlay(view, np.asarray(m), alpha, cmap, smooth)) for m in (raw, rolled)]


def sheet_of(cap, view: Image.Image, *drawn) -> Image.Image:
    """:func:`pictures_of` side by side (the download)."""
    return side_by_side(*pictures_of(cap, view, *drawn))


def show(ctx: Context) -> None:
    cap = ctx.cap
    last_layer = cap.num_layers
    no_class_token_note(cap, last_layer - 1)  # the maps below are not a class token's when it has none
    st.markdown(t("analysis.rollout.explain"))
    for spec in LINKED:
        spec.prepare(st.session_state, ctx)
    c1, c2, c3 = st.columns([3, 2, 2])
    first, last = c1.slider(t("analysis.rollout.layers"), 1, last_layer, key="rollout_layers")
    fusion = c2.selectbox(
        t("analysis.fusion"), HEAD_FUSIONS, key="rollout_fusion", format_func=lambda h: t(f"view.head_{h}"),
        placeholder=t("classroom.choose"),
    )
    discard = c3.slider(
        t("analysis.rollout.discard"), 0.0, 0.95, step=0.05, key="rollout_discard",
        help=t("analysis.rollout.discard_help"), format="%.2f",
    )
    args = (first, last, fusion, discard)
    if rollout_refusal(cap, first - 1, last - 1) is not None:  # across a change of grid: one sentence
        own = rollout_layers(cap)
        st.info(t("analysis.rollout.refused", first=first, last=last, a=own[0] + 1, b=own[1] + 1))
        return
    rolled = heavy.run(  # (h, w); ~2 s at 518 px: shared and bounded across sessions
        "rollout", ctx.cap_key, args, lambda: rollout_map(cap, first - 1, last - 1, fusion, discard),
        t("jobs.rollout"),
    )
    raw = cap.summary_map(last - 1, fusion)  # (h, w): the CLS row, or the mean received without a class token
    st.subheader(t("analysis.rollout.title", first=first, last=last, fusion=t(f"view.head_{fusion}")))

    drawn = (last, fusion, np.asarray(rolled), ctx.alpha, ctx.cmap, ctx.smooth)
    raw_picture, rolled_picture = pictures_of(cap, ctx.view, *drawn)
    pictures = [
        (raw, raw_picture, t("analysis.rollout.raw_title", layer=last),
         t("analysis.rollout.raw_caption", layer=last), t("analysis.weight_units")),
        (rolled, rolled_picture, t("analysis.rollout.roll_title", first=first, last=last),
         t("analysis.rollout.roll_caption", first=first, last=last), t("analysis.rollout.units")),
    ]
    if ctx.narrow:  # one column on a phone: the rollout, which the title names, first; the raw layer under it
        pictures.reverse()
    for column, (grid_map, picture, title, caption, units) in zip(st.columns(2, gap="large"), pictures):
        with column:
            st.markdown(f"**{title}**")
            st.image(picture, caption=caption)
            colour_scale(np.asarray(grid_map), ctx.cmap, picture.width, units)
    name = f"rollout_layers{first}-{last}_{fusion}.png"
    download_png(ctx.deferred(sheet_of, *drawn), name, key="download_rollout")
    download_figure(ctx, ("cls", "rollout"), (last - 1,), (fusion,), name.removesuffix(".png"), key="download_rollout_figure",
                    rollout=(first - 1, last - 1, fusion, discard))


register(View("rollout", show, controls=frozenset({OPACITY, COLOURS, SMOOTH}), order=50, linked=LINKED))
