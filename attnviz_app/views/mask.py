"""DINO-style mass masks: the fewest patches that hold X % of the class token's attention."""
from __future__ import annotations

import streamlit as st
from PIL import Image

from attnviz.masks import DEFAULT_MASS, draw_mask, mass_mask
from ..text import t

from .base import Context, HEAD, LAYER, Linked, View, number, one_of, register
from .cls import no_class_token_note
from .common import download_png, enlarge, head_label, head_part

ONE, HEADS = "one", "heads"
LINKED = (
    Linked("mass", "mask_mass", number(5, 99, 1), lambda ctx: round(DEFAULT_MASS * 100)),
    Linked("mask", "mask_source", one_of((ONE, HEADS)), lambda ctx: ONE),
)
THUMB_PX = 224


def one_mask(cap, view: Image.Image, layer: int, head, mass: float) -> Image.Image:
    """The mask of ``layer`` and ``head`` holding ``mass`` of its attention, over ``view``, enlarged."""
    return enlarge(draw_mask(view, mass_mask(cap.summary_map(layer, head), mass).keep))


def head_masks(cap, view: Image.Image, layer: int, mass: float) -> list[tuple[Image.Image, int]]:
    """Each head's mask at ``layer`` as a thumbnail, with the number of patches it keeps."""
    out = []
    for head in range(cap.heads(layer)):
        mask = mass_mask(cap.summary_map(layer, head), mass)
        out.append((draw_mask(view, mask.keep).resize((THUMB_PX, THUMB_PX), Image.Resampling.LANCZOS), mask.count))
    return out


def head_masks_sheet(cap, view: Image.Image, layer: int, mass: float) -> Image.Image:
    """:func:`head_masks` side by side, three to a row (the download)."""
    thumbs = [thumb for thumb, _ in head_masks(cap, view, layer, mass)]
    per_row = min(len(thumbs), 3)
    rows = -(-len(thumbs) // per_row)
    sheet = Image.new("RGB", (per_row * (THUMB_PX + 8), rows * (THUMB_PX + 8)), "white")
    for i, thumb in enumerate(thumbs):
        sheet.paste(thumb, ((i % per_row) * (THUMB_PX + 8), (i // per_row) * (THUMB_PX + 8)))
    return sheet


def show(ctx: Context) -> None:
    cap = ctx.cap
    h, w = cap.map_grid(ctx.layer)  # the layer's own grid
    no_class_token_note(cap, ctx.layer)  # the maps below are not a class token's when it has none
    st.markdown(t("analysis.mask.explain"))
    for spec in LINKED:
        spec.prepare(st.session_state, ctx)
    c1, c2 = st.columns([3, 2])
    percent = c1.slider(t("analysis.mask.mass"), 5, 99, step=1, key="mask_mass")
    source = c2.radio(
        t("analysis.mask.source"), [ONE, HEADS], key="mask_source", horizontal=True,
        format_func=lambda s: t(f"analysis.mask.source_{s}"),
    )
    st.subheader(t("analysis.mask.title", mass=percent))
    if source == ONE:
        mask = mass_mask(cap.summary_map(ctx.layer, ctx.head), percent / 100)
        st.image(enlarge(draw_mask(ctx.view, mask.keep)),
                 caption=f"{t('view.layer')} {ctx.layer + 1}, {head_label(ctx.head)}")
        st.markdown(t(
            "analysis.mask.caption", count=mask.count, patches=h * w, area=100 * mask.count / (h * w),
            mass=100 * mask.mass,
        ))
        draw, drawn = one_mask, (ctx.layer, ctx.head, percent / 100)
        name = f"mask{percent}_layer{ctx.layer + 1}_head{head_part(ctx.head)}.png"
    else:
        per_row = min(cap.heads(ctx.layer), 3)
        columns = st.columns(per_row)
        for head, (thumb, count) in enumerate(head_masks(cap, ctx.view, ctx.layer, percent / 100)):
            columns[head % per_row].image(thumb, caption=t("analysis.mask.head_caption", n=head + 1, count=count))
        draw, drawn = head_masks_sheet, (ctx.layer, percent / 100)
        name = f"mask{percent}_layer{ctx.layer + 1}_all_heads.png"
    download_png(ctx.deferred(draw, *drawn), name, key="download_mask")


def controls_in(state, controls: frozenset[str]) -> frozenset[str]:
    """One mask per head: Head is not read then."""
    return controls - {HEAD} if state.get("mask_source") == "heads" else controls


register(View("mask", show, controls=frozenset({LAYER, HEAD}), order=60, controls_in=controls_in,  # no colours
              linked=LINKED))
