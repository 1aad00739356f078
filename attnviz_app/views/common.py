"""Small Streamlit pieces several views share."""
from __future__ import annotations

import io
import re
from contextlib import nullcontext
from typing import Callable

import numpy as np
import pandas as pd
import streamlit as st
from PIL import Image

from attnviz import render
from ..text import t

DISPLAY_PX = 448  # small inputs are shown at least this large, each model pixel a crisp block


def enlarge(picture: Image.Image) -> Image.Image:
    return render.enlarge(picture, DISPLAY_PX)


def head_label(head) -> str:
    return t(f"view.head_{head}") if isinstance(head, str) else t("view.head_n", n=head + 1)


def heatmap(picture: Image.Image, grid_map: np.ndarray, cmap: str, caption: str, present: bool = False) -> None:
    """Show an overlay with its colour bar and the numbers at both ends of the scale. ``present``: as wide as
    the column, which the presenter view's CSS caps by the screen's height (classroom.PRESENT_CSS), and
    without the long caption."""
    width = "stretch" if present else "content"
    st.image(picture, caption=None if present else caption, width=width)
    st.image(render.colorbar(cmap, width=picture.width, height=14), width=width)
    st.caption(t("view.scale", lo=float(grid_map.min()), hi=float(grid_map.max())))


def download_png(draw: Callable[[], Image.Image], file_name: str, key: str) -> None:
    """A download button for the picture ``draw()`` makes (e.g. :meth:`Context.deferred`), drawn and encoded
    only when clicked: encoding the 588 px class-token picture on every run was a third of a Layer change's
    server time, and a session keeps its buttons' functions until its tab closes (a 588 px picture held by
    each is 1 MB per open tab)."""
    download_file(lambda: png_bytes(draw()), file_name, key=key)


# ---- Shared by the analysis views (rollout, query, matrix, heads, mask, stats, relevance) ----

QUERY_COLOUR = (0, 255, 255)  # cyan: the query patch / chosen cell, visible on every colour map
# vega-embed's options, from the spec's usermeta. SVG said outright, as Streamlit draws a chart of over 2000 points
# on a canvas, which a column narrower than the chart cannot scale (BASE_CSS scales SVG; a scaled canvas clicks wrong);
# a canvas where many thousands of points must draw quickly.
SVG = {"embedOptions": {"renderer": "svg"}}
CANVAS = {"embedOptions": {"renderer": "canvas"}}
CHART_PX = 512  # side of a clickable picture: fits the wide column of a 1280 px screen
NARROW_CHART_PX = 340  # … and a phone's 358 px column


def png_bytes(picture: Image.Image) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(picture: Image.Image) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(png_bytes(picture)).decode("ascii")


def figure_png(fig) -> bytes:
    """A matplotlib ``Figure`` as PNG bytes. Build figures with ``matplotlib.figure.Figure``, never
    pyplot: pyplot keeps global state that the sessions' threads would share."""
    from matplotlib.text import Text

    from attnviz.figure import CJK_FONT, LATIN_FONT, cjk_font

    # Chinese labels fall back to the CJK font where one is installed. cjk_font() tells matplotlib of it first: a
    # font list cached before the font was installed knows no CJK font, and every Chinese character drew as a box.
    families = [LATIN_FONT, CJK_FONT] if cjk_font() else [LATIN_FONT]
    for text in fig.findobj(Text):
        text.set_fontfamily(families)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="PNG", dpi=120, bbox_inches="tight")
    return buffer.getvalue()


def download_file(data, file_name: str, key: str, mime: str = "image/png", label: str | None = None, help=None) -> None:
    """A download button; ``data`` may be a callable so large files are only built when clicked."""
    st.download_button(
        label or t("view.download"), data, file_name=file_name, mime=mime, key=key, help=help, on_click="ignore"
    )


def download_figure(ctx, views: tuple[str, ...], layers: tuple[int, ...], heads: tuple, stem: str, key: str,
                    rollout: tuple | None = None) -> None:
    """"Download SVG" and "Download PDF" beside a picture: the same maps as vector figures
    (:mod:`attnviz.figure`), each drawn only when its button is clicked."""
    from attnviz import figure, i18n

    lang = st.session_state.get("lang") or i18n.DEFAULT
    capture, view = ctx.later()  # the buttons' functions outlive the run: they must not hold the capture
    cmap, alpha = ctx.cmap, ctx.alpha

    def build(format: str):
        return lambda: figure.figure_bytes(capture(), format, layers=layers, heads=heads, views=views, picture=view(),
                                           cmap=cmap, alpha=alpha, lang=lang, rollout=rollout)

    _vector_buttons(build, stem, key, t("figure.download_help"))


def download_chart(chart, stem: str, key: str) -> None:
    """"Download SVG" and "Download PDF" beside an Altair chart: the chart as the page draws it, through
    :func:`attnviz.figure.chart_bytes`, converted only when its button is clicked. Its words are already
    in the page's language (the chart was built with ``t``)."""
    from attnviz import figure

    _vector_buttons(lambda format: lambda: figure.chart_bytes(chart, format), stem, key, t("figure.chart_help"))


def _vector_buttons(build, stem: str, key: str, help: str) -> None:
    """The two buttons side by side, or one under the other where the column is too narrow for both (in two
    columns of their own, a narrow column's halves cut their labels off: "Download as SV…");
    ``build(format)`` is the callable that makes the file."""
    with st.container(horizontal=True, wrap=True):
        download_file(build("svg"), f"{stem}.svg", key=f"{key}_svg", mime="image/svg+xml",
                      label=t("figure.download_svg"), help=help)
        download_file(build("pdf"), f"{stem}.pdf", key=f"{key}_pdf", mime="application/pdf",
                      label=t("figure.download_pdf"), help=help)


def markdown_table(header: list[str], rows: list[list[str]], transposed: bool = False) -> str:
    """A Markdown table: unlike a data frame's, its cells wrap, so it keeps within a phone's 358 px column. ``transposed``
    (a phone): a row per column, a column per row, so that the lesson's worked example's seven quantities of three keys
    fit that column (its weights, the result, were cut off at the right)."""
    if transposed:
        header, rows = [header[0], *(row[0] for row in rows)], [[name, *(row[i] for row in rows)]
                                                                for i, name in enumerate(header) if i]
    line = lambda cells: " ".join(f"| {' | '.join(cells)} |".split())  # noqa: E731  (an empty cell is "| |")
    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])


def escape_markdown(text: str) -> str:
    """``text`` shown as it is inside Markdown: a model's class name can hold ``*``, ``_``, ``|`` or ``$``."""
    return re.sub(r"([\\`*_\[\]<>|$~])", r"\\\1", text)


def head_part(head) -> str:
    """The head as it appears in file names: 1-based number or mean/max/min."""
    return head if isinstance(head, str) else str(head + 1)


def token_label(index: int, num_prefix_tokens: int, grid: tuple[int, int], short: bool = False) -> str:
    """CLS, register k, or patch (row, column), 1-based as a person counts."""
    if index == 0 and num_prefix_tokens > 0:  # with no prefix tokens, token 0 is the first patch
        return "CLS" if short else t("analysis.cls_token")
    if index < num_prefix_tokens:
        return f"reg {index}" if short else t("analysis.register", k=index)
    row, col = divmod(index - num_prefix_tokens, grid[1])
    return t("analysis.patch_short" if short else "analysis.patch", row=row + 1, col=col + 1)


def mark_patch(picture: Image.Image, grid: tuple[int, int], patch: tuple[int, int]) -> Image.Image:
    """``picture`` with a cyan frame (on a black one, visible on any colour) round grid cell ``patch``."""
    row, col = patch
    width = max(2, round(min(picture.height / grid[0], picture.width / grid[1]) / 8))
    framed = render.outline(picture, grid, [(row, col, (0, 0, 0))], width + 2)
    return render.outline(framed, grid, [(row, col, QUERY_COLOUR)], width)


def colour_scale(grid_map: np.ndarray, cmap: str, width: int, units: str, stretch: bool = False) -> None:
    """The colour bar under a picture, with the values at both ends and their units; ``stretch``: as wide as the
    column, under a picture drawn so (the presenter view's)."""
    st.image(render.colorbar(cmap, width=width, height=14), width="stretch" if stretch else "content")
    st.caption(t("analysis.scale_units", lo=float(grid_map.min()), hi=float(grid_map.max()), units=units))


def table_layer(table: pd.DataFrame):
    """A chart layer that draws nothing and holds ``table``: the numbers the chart draws, under headings in the
    page's language. Put first in a chart, it is what the chart toolbar's "Show data" opens (Streamlit shows a
    chart's first dataset), where a reader saw a picture's data URL or a line's end points under internal names.
    Being a layer of the chart, Vega knows the dataset when Streamlit updates the chart's data."""
    import altair as alt

    return alt.Chart(table).mark_point(aria=False).transform_filter("false")


GUIDES = {"x": "axis", "y": "axis", "color": "legend", "fill": "legend", "stroke": "legend", "shape": "legend",
          "size": "legend", "opacity": "legend", "strokeDash": "legend"}


def described(chart):
    """``chart`` with each of its axes and legends described for a screen reader in the page's language ("Y 軸：層"),
    in every layer and concatenated part. Vega describes a guide it is given no description for in English ("Y-axis
    titled '層' for a linear scale with values from 1 to 12"). Returns the same chart, changed in place."""
    import altair as alt

    for part in ("layer", "hconcat", "vconcat", "concat"):
        for sub in chart._get(part, ()):
            described(sub)
    encoding = chart._get("encoding", None)
    for channel, kind in GUIDES.items():
        ch = encoding._get(channel, None) if encoding is not None else None
        if ch is None or type(ch).__name__.endswith("Value"):  # no such channel, or a constant: no guide
            continue
        guide = ch._get(kind)  # Undefined: Vega-Lite's own; None: switched off (axis=None)
        if guide is None:
            continue
        title = alt.Undefined if guide is alt.Undefined else guide._get("title")
        title = ch._get("title") if title is alt.Undefined else title
        if title is alt.Undefined:  # a layer that shares another's axis or legend, which gives the title
            continue
        word = "x_axis" if channel == "x" else "y_axis" if channel == "y" else "legend"
        text = t(f"chart.{word}", title=title) if title else t(f"chart.{word}_untitled")
        if guide is alt.Undefined:
            setattr(ch, kind, alt.Axis(description=text) if kind == "axis" else alt.Legend(description=text))
        else:
            guide.description = text
    return chart


def tooltip_table(data: pd.DataFrame, tooltip: list) -> pd.DataFrame:
    """The columns of ``data`` a chart's tooltip shows (``alt.Tooltip("field:type", title=...)``), headed by their
    titles: where the tooltip tells one mark's numbers, the table (:func:`table_layer`) tells them all."""
    tips = [tip.to_dict() for tip in tooltip]  # {"field": …, "title": …, "type": …}
    return data[[tip["field"] for tip in tips]].set_axis([tip["title"] for tip in tips], axis=1)


def patch_table(values: np.ndarray, value_name: str) -> pd.DataFrame:
    """(h, w) values over the patch grid → a row per patch, row by row: the patch's row and column (from 1, as the
    page counts) and its value under ``value_name``."""
    h, w = values.shape
    rows, columns = np.divmod(np.arange(h * w), w)
    return pd.DataFrame({t("analysis.row"): rows + 1, t("analysis.column"): columns + 1,
                         value_name: np.asarray(values, dtype=np.float64).reshape(-1)})


def clickable_picture(picture: Image.Image, grid: tuple[int, int], key: str, on_select, narrow: bool = False,
                      name: str | None = None, table: pd.DataFrame | None = None) -> None:
    """``picture`` drawn by Altair with an invisible grid of patches on top; a click selects a patch.

    The selection ``patch`` holds ``{"row": r, "col": c}`` (0-based); ``on_select`` runs as the callback. ``name``:
    what a screen reader says for the picture (the heading above it); each cell is named by its patch. ``table``:
    the numbers the picture shows (:func:`patch_table`), which "Show data" opens; at the picture's grid, each cell's
    tooltip and spoken name say its value too. A picture without numbers (the plain photo) has no "Show data"
    (BASE_CSS hides it in a ``picture_only`` container).
    """
    import altair as alt

    h, w = grid
    # the browser scales the picture; the cells stay exact
    side = min(picture.width, NARROW_CHART_PX if narrow else CHART_PX)  # a narrower column scales it (BASE_CSS)
    cells = pd.DataFrame([(r, c, r + 1, c + 1, t("analysis.patch", row=r + 1, col=c + 1))
                          for r in range(h) for c in range(w)], columns=["row", "col", "r1", "c1", "label"])
    tooltip = [alt.Tooltip("r1:Q", title=t("analysis.row")), alt.Tooltip("c1:Q", title=t("analysis.column"))]
    if table is not None and len(table) == h * w:  # a value per cell (a pooled Swin stage's is at another grid)
        value_name = str(table.columns[-1])
        cells["value"] = table.iloc[:, -1].to_numpy()
        cells["label"] = [f"{label}: {value_name} {value:.4f}" for label, value in zip(cells["label"], cells["value"])]
        tooltip.append(alt.Tooltip("value:Q", format=".4f", title=value_name))
    x = alt.X("col:Q", scale=alt.Scale(domain=[0, w], nice=False, zero=False), axis=None)
    y = alt.Y("row:Q", scale=alt.Scale(domain=[h, 0], nice=False, zero=False), axis=None)
    pick = alt.selection_point(name="patch", fields=["row", "col"], on="click", clear=False)
    hover = alt.selection_point(name="hover", fields=["row", "col"], on="pointerover", clear="pointerout")
    whole = pd.DataFrame([{"col": 0, "row": 0, "c1": w, "r1": h, "url": data_url(picture)}])
    # aria=False: a screen reader's description of the picture was its data URL, tens of kB of base64
    photo = alt.Chart(whole).mark_image(aspect=False, aria=False).encode(x=x, x2="c1:Q", y=y, y2="r1:Q", url="url:N")
    # Nearly transparent cells (fully transparent ones catch no clicks); the hovered one gets a white frame.
    grid_layer = alt.Chart(cells).mark_rect(fill="white", fillOpacity=0.01, stroke="white", strokeWidth=2).encode(
        x=x, x2="c1:Q", y=y, y2="r1:Q", description="label:N",  # a screen reader's name for the cell
        strokeOpacity=alt.condition(hover, alt.value(0.9), alt.value(0.0), empty=False),
        tooltip=tooltip,
    ).add_params(pick, hover)
    layers = [photo, grid_layer] if table is None else [table_layer(table), photo, grid_layer]
    chart = alt.layer(*layers).properties(width=side, height=side, usermeta=SVG).configure_view(strokeWidth=0)
    with st.container(key=f"picture_only_{key}") if table is None else nullcontext():
        st.altair_chart(described(chart), key=key, on_select=on_select, selection_mode="patch", width="content", alt=name)


def selected_points(state, name: str) -> list[dict]:
    """The points of selection ``name`` in an Altair chart's widget state (empty when none)."""
    try:
        return list(state["selection"][name] or [])
    except (KeyError, TypeError):
        return []


WINDOW_COLOUR = (255, 255, 255)


def window_lines(picture, cap, layer: int, token: int | None = None):
    """``picture`` with every window of ``layer`` outlined, or only the one ``token`` attends within
    (nothing where the layer attends globally: one window of every token)."""
    lay = cap.layout(layer)
    if lay.num_windows == 1:
        return picture
    tokens = [token] if token is not None else [int(w[0]) for w in lay.windows]
    for tok in tokens:
        picture = render.outline_region(picture, cap.window_mask(layer, tok), WINDOW_COLOUR,
                                        max(1, round(picture.width / lay.keys_grid[1] / 6)) if token is None else None)
    return picture


def attending(lay) -> str:
    """How a layer's tokens attend, in a few words of the page's language (:meth:`attnviz.stages.LayerLayout.attends`):
    inside windows, every token to every token, only the class token asking, …"""
    key, values = lay.attends()
    return t(f"view.place_{key}", **values)
