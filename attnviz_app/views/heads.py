"""Every layer × head at a glance: small CLS maps; clicking one chooses that layer and head."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st
from PIL import Image, ImageDraw

from attnviz import render
from attnviz.stages import mean_received
from ..text import t

from .base import ALL, Context, View, register
from .cls import no_class_token_note
from .common import described, QUERY_COLOUR, data_url, download_figure, download_png, head_label, selected_points, table_layer

CHART_KEY = "heads_chart"
CELL_PX = 72  # side of one small map on the page
NARROW_PX = 300  # a phone's column (358 px) less the layer axis: all heads + mean fit across it
PRESENT_PX = 600  # a 720 px projector less the head axis: all layers fit down it
MEAN = "mean"


def cls_maps(cap) -> list[np.ndarray]:
    """Per layer (H_l + 1, h_l, w_l): every head's summary map at the layer's own grid (the CLS row where the class
    token asks, else the mean attention each patch receives), and the mean of the heads last."""
    maps = []
    for layer in range(cap.num_layers):
        lay = cap.layout(layer)
        if cap.summary_kind(layer) == "cls":
            rows = cap.layer_rows(layer, 0)[:, lay.num_key_prefix:].cpu().numpy()  # (H, P): only the CLS rows
            heads = rows.reshape(-1, *lay.keys_grid)
        else:  # the window weights once for all heads
            weights = cap.window_weights(layer).transpose(0, 1)  # (H, W, Tq, Tk)
            heads = np.stack([mean_received(lay, weights[h]) for h in range(lay.num_heads)])
        maps.append(np.concatenate([heads, heads.mean(0, keepdims=True)]))
    return maps


def apply_cell(state) -> None:
    """Callback body: make the clicked cell the page's layer and head (widgets read these keys)."""
    points = selected_points(state, "cell")
    if points:
        layer, head = int(points[0]["layer"]), str(points[0]["head"])
        st.session_state["layer"] = layer  # 1-based, like the layer slider
        st.session_state["head"] = MEAN if head == MEAN else int(head)  # 1-based head or "mean"


def _clicked() -> None:
    apply_cell(st.session_state.get(CHART_KEY))


def montage(tiles: list[list[Image.Image]], chosen: tuple[int, int], gap: int = 4, margin: int = 40) -> Image.Image:
    """One PNG of the whole grid, rows = layers, columns = heads, labelled, with the chosen cell framed."""
    size = tiles[0][0].width
    rows, cols = len(tiles), max(len(row) for row in tiles)  # a layer with fewer heads: its mean in the last column
    sheet = Image.new("RGB", (margin + cols * (size + gap), margin + rows * (size + gap)), "white")
    draw = ImageDraw.Draw(sheet)
    for c in range(cols):
        name = MEAN if c == cols - 1 else str(c + 1)
        draw.text((margin + c * (size + gap) + size // 2 - 8, margin // 2 - 6), name, fill="black")
    for r, row in enumerate(tiles):
        draw.text((8, margin + r * (size + gap) + size // 2 - 6), f"L{r + 1}", fill="black")
        for c, tile in enumerate(row):
            c = cols - 1 if c == len(row) - 1 else c
            x, y = margin + c * (size + gap), margin + r * (size + gap)
            sheet.paste(tile, (x, y))
            if (r, c) == chosen:
                draw.rectangle((x - 2, y - 2, x + size + 1, y + size + 1), outline=QUERY_COLOUR, width=3)
    return sheet


def brightest(maps: np.ndarray) -> pd.DataFrame:
    """What the tiles show, in numbers ("Show data"): per layer and head (the mean last), its brightest patch and
    that patch's weight. ``maps``: :func:`cls_maps`."""
    records = []
    for l, layer_maps in enumerate(maps):
        columns, _, w = layer_maps.shape
        flat = layer_maps.reshape(columns, -1)
        top = flat.argmax(-1)  # (H + 1,)
        heads = [*(str(k + 1) for k in range(columns - 1)), t("analysis.heads.mean")]
        records += [{
            t("analysis.heads.layer"): l + 1, t("analysis.heads.head"): heads[c],
            t("analysis.heads.brightest"): t("analysis.patch", row=top[c] // w + 1, col=top[c] % w + 1),
            t("analysis.matrix.colorbar"): float(flat[c, top[c]]),
        } for c in range(columns)]
    return pd.DataFrame(records)


def tiles_of(cap, view: Image.Image, cell: int, alpha: float, cmap: str, smooth: bool,
             maps: np.ndarray | None = None) -> list[list[Image.Image]]:
    """Per layer, each head's CLS map and then their mean, over ``view`` at ``cell`` px (``maps``: cls_maps)."""
    maps = cls_maps(cap) if maps is None else maps  # per layer (H_l + 1, h_l, w_l)
    small = view.resize((cell, cell), Image.Resampling.BICUBIC)
    return [[render.overlay(small, layer_maps[c], alpha=alpha, cmap=cmap, smooth=smooth)
             for c in range(len(layer_maps))] for layer_maps in maps]


def sheet_of(cap, view: Image.Image, cell: int, alpha: float, cmap: str, smooth: bool,
             chosen: tuple[int, int]) -> Image.Image:
    """The page's grid of small maps as one picture (the download)."""
    return montage(tiles_of(cap, view, cell, alpha, cmap, smooth), chosen)


def show(ctx: Context) -> None:
    cap = ctx.cap
    num_layers, num_heads = cap.num_layers, cap.num_heads
    no_class_token_note(cap, cap.num_layers - 1)  # the maps below are not a class token's when it has none
    st.subheader(t("analysis.heads.title", layers=num_layers, heads=num_heads))
    st.caption(t("analysis.heads.caption"))
    cell = CELL_PX
    if ctx.narrow:
        cell = min(cell, NARROW_PX // (num_heads + 1) - 8)
    if ctx.present:
        cell = min(cell, PRESENT_PX // num_layers - 8)
    cell = max(16, cell)
    drawn = (cell, ctx.alpha, ctx.cmap, ctx.smooth)
    maps = cls_maps(cap)
    tiles = tiles_of(cap, ctx.view, *drawn, maps=maps)
    names = [*(str(k + 1) for k in range(num_heads)), MEAN]
    chosen_head = MEAN if ctx.head == MEAN else (str(ctx.head + 1) if isinstance(ctx.head, int) else None)
    columns = [[*(str(k + 1) for k in range(len(row) - 1)), MEAN] for row in tiles]  # each layer's own heads
    cells = pd.DataFrame([
        {"layer": l + 1, "head": column[c], "url": data_url(tiles[l][c]),
         "chosen": (l == ctx.layer and column[c] == chosen_head),
         "label": f"{t('view.layer')} {l + 1}, {head_label(MEAN if column[c] == MEAN else c)}"}
        for l, column in enumerate(columns) for c in range(len(column))
    ])
    mean_word = t("analysis.heads.mean").replace("'", "")
    label = f"datum.value == 'mean' ? '{mean_word}' : datum.value"
    x = alt.X("head:N", sort=names, title=t("analysis.heads.head"),
              axis=alt.Axis(orient="top", labelAngle=0, labelExpr=label),
              scale=alt.Scale(paddingInner=0.08, paddingOuter=0.02))
    y = alt.Y("layer:O", title=t("analysis.heads.layer"), scale=alt.Scale(paddingInner=0.08, paddingOuter=0.02))
    pick = alt.selection_point(name="cell", fields=["layer", "head"], on="click", clear=False)
    base = alt.Chart(cells).encode(x=x, y=y)
    images = base.mark_image(width=cell, height=cell, aria=False).encode(url="url:N")  # not its data URL, read aloud
    frames = base.mark_rect(fill="white", fillOpacity=0.01, strokeWidth=3).encode(
        description="label:N",  # what a screen reader says for the tile
        stroke=alt.condition("datum.chosen", alt.value("#00ffff"), alt.value("transparent")),
        tooltip=[alt.Tooltip("layer:O", title=t("analysis.heads.layer")),
                 alt.Tooltip("head:N", title=t("analysis.heads.head"))],
    ).add_params(pick)
    step = cell + 8
    chart = alt.layer(table_layer(brightest(maps)), images, frames).properties(
        width=alt.Step(step), height=alt.Step(step)
    ).configure_view(strokeWidth=0).configure_axis(labelFontSize=13, titleFontSize=14)
    st.altair_chart(described(chart), key=CHART_KEY, on_select=_clicked, selection_mode="cell", width="content",
                    alt=t("analysis.heads.title", layers=num_layers, heads=num_heads))
    chosen = (ctx.layer, names.index(chosen_head) if chosen_head in names else -1)
    download_png(ctx.deferred(sheet_of, *drawn, chosen), "all_heads.png", key="download_heads")
    download_figure(ctx, ("heads",), tuple(range(num_layers)), ("mean",), "all_heads", key="download_heads_figure")


register(View("heads", show, controls=ALL, order=40, beginner=True))
