"""Class-specific maps (Chefer et al. 2021) for one of the top-5 classes of a classifier."""
from __future__ import annotations

import numpy as np
import streamlit as st
from PIL import Image

from attnviz import render
from attnviz.relevance import RelevanceError, relevance_map
from .. import heavy
from ..text import t

from .base import COLOURS, Context, OPACITY, SMOOTH, View, register
from .common import colour_scale, download_png, enlarge

TOP = 5


def top_classes(ctx: Context) -> list[tuple[int, str, float]]:
    """(class index, label, probability) of the most probable classes; empty without a classifier."""
    if ctx.model.labels is None:
        return []
    probs = ctx.cap.output.float().softmax(-1)
    p, i = probs.topk(min(TOP, probs.shape[0]))
    return [(j, ctx.model.labels[j], q) for q, j in zip(p.tolist(), i.tolist())]


def picture_of(cap, view: Image.Image, grid_map: np.ndarray, alpha: float, cmap: str, smooth: bool) -> Image.Image:
    """The relevance map over ``view``, enlarged (``cap`` unused: the map is the shared job's result)."""
    return enlarge(render.overlay(view, grid_map, alpha=alpha, cmap=cmap, smooth=smooth))


def show(ctx: Context) -> None:
    st.markdown(t("analysis.relevance.explain"))
    top = top_classes(ctx)
    if not top:  # a self-supervised model: say what the map needs and how to get there, no dead controls
        st.info(t("classroom.relevance_self_supervised", model=ctx.model.public_name), icon=":material/info:")
        return
    index, label, _ = st.radio(
        t("analysis.relevance.choose"), top, key=None, horizontal=True,
        format_func=lambda c: t("analysis.relevance.option", label=c[1], p=c[2]),
    )
    cap = ctx.cap
    try:
        grid_map = heavy.run(  # a forward and a backward pass: shared and bounded across sessions
            "relevance", ctx.cap_key, (index,), lambda: relevance_map(ctx.model, cap, index),
            t("analysis.relevance.computing"),
        )
    except RelevanceError as e:
        st.info(t("analysis.relevance.disabled", reason=str(e)))
        return
    st.subheader(t("analysis.relevance.title", label=label))
    drawn = (grid_map, ctx.alpha, ctx.cmap, ctx.smooth)
    picture = picture_of(cap, ctx.view, *drawn)
    st.image(picture, caption=t("analysis.relevance.caption", label=label))
    colour_scale(grid_map, ctx.cmap, picture.width, t("analysis.relevance.units"))
    download_png(ctx.deferred(picture_of, *drawn), f"relevance_class{index}.png", key="download_relevance")


register(View("relevance", show, controls=frozenset({OPACITY, COLOURS, SMOOTH}), order=80, needs_classifier=True,
              no_layer_head="classroom.no_layer_head_relevance"))
