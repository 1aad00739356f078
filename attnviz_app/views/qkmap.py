"""The Q/K map (AttentionViz): one head's queries and keys as points, and the atlas of every head."""
from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from attnviz import qkmap
from .. import heavy
from ..text import listed, t

from .base import HEAD, LAYER, Context, Linked, View, one_of, register
from .common import described, CANVAS, SVG, data_url, download_chart, selected_points, table_layer, token_label, tooltip_table
from .query import current_query, set_query

CHART_KEY = "qk_chart"
ATLAS_KEY = "qk_atlas"
COLOUR_CHOICES = ("row", "column", "brightness", "hue", "cls_attention")  # "photo" is the dataset page's
LINKED = (
    Linked("method", "qk_method", one_of(qkmap.METHODS), lambda ctx: qkmap.METHODS[0]),
    Linked("normalize", "qk_normalize", one_of(qkmap.NORMALIZATIONS), lambda ctx: qkmap.NORMALIZATIONS[0]),
    Linked("colour", "qk_colour", one_of(COLOUR_CHOICES), lambda ctx: COLOUR_CHOICES[0]),
)
SVG_POINTS = 3000  # up to this many points (the default model at 518 px: 2740) the map is SVG (common.SVG)
TOP = 5  # keys drawn as lines from the chosen query
SCATTER_PX, PRESENT_PX, NARROW_PX = 520, 420, 290  # the scatter: a desktop, a projector's 3/5 column, a phone
PHOTO_PX, PRESENT_PHOTO_PX, NARROW_PHOTO_PX = 240, 200, 200


def _picked_point(prefix: int, grid: tuple[int, int]) -> None:
    """Click on a point: a query becomes the session's query (the Query view's too); a key is ignored. Run before
    the page, so the page's address names the query clicked."""
    points = selected_points(st.session_state.get(CHART_KEY), "pick")
    if points and points[0].get("kind") == "query":
        set_query(prefix, grid, int(points[0]["token"]))


def _picked_head() -> None:
    points = selected_points(st.session_state.get(ATLAS_KEY), "tile")
    if points:
        st.session_state["layer"] = int(points[0]["layer"])  # 1-based, as the Layer slider counts
        st.session_state["head"] = int(points[0]["head"])


def _open_query_view() -> None:
    st.session_state["view"] = "query"


def _head(ctx: Context) -> int:
    """The one head the map shows: the chosen head, or head 1 while Head is a mean / max / min (said on the page)."""
    if isinstance(ctx.head, str):
        st.info(t("qkmap.one_head", fusion=t(f"view.head_{ctx.head}")), icon=":material/info:")
        return 0
    return ctx.head


def measured_sentence(stats: qkmap.QKStats, layer: int, head: int) -> str:
    """What this map shows, from its own numbers."""
    best = max(stats.row_r, stats.column_r)
    axis = t("qkmap.axis_row") if stats.row_r >= stats.column_r else t("qkmap.axis_column")
    verdict = ("qkmap.by_position" if best >= 0.7 else "qkmap.partly_position" if best >= 0.4 else "qkmap.not_position")
    return " ".join([
        t(f"qkmap.near_{stats.closeness}", layer=layer + 1, head=head + 1, rho=stats.distance_rho, pairs=stats.pairs),
        t(verdict, row=stats.row_r, col=stats.column_r, axis=axis),
    ])


def softmax_change(cap, layer: int, head: int, qk: qkmap.QKMap) -> float:
    """Largest change of any attention weight of this head when the normalised q and k replace the capture's."""
    n = cap.layout(layer).num_tokens
    q, k = qk.vectors[:n], qk.vectors[n:2 * n]
    logits = q @ k.T * cap.layout(layer).scale
    weights = np.exp(logits - logits.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    raw = qk.logits[0]
    base = np.exp(raw - raw.max(1, keepdims=True))
    base /= base.sum(1, keepdims=True)
    return float(np.abs(weights - base).max())


def scatter(qk: qkmap.QKMap, values: np.ndarray, picture, query: int, colour_title: str, narrow: bool,
            present: bool = False):
    """The Altair chart: the points (circles = queries, squares = keys), lines to the chosen query's top keys,
    and beside it the photo with the hovered point's patch outlined (drawn in the browser, no rerun)."""
    import altair as alt
    import pandas as pd

    h, w = qk.grid
    side = NARROW_PX if narrow else PRESENT_PX if present else SCATTER_PX
    plot = points_plot(qk, values, query, colour_title, side, narrow)
    photo_side = NARROW_PHOTO_PX if narrow else PRESENT_PHOTO_PX if present else PHOTO_PX
    patches = pd.DataFrame({"row": qk.row, "col": qk.column, "r1": qk.row + 1, "c1": qk.column + 1})
    patches = patches[patches["row"] >= 0]
    cx = alt.X("col:Q", scale=alt.Scale(domain=[0, w], nice=False, zero=False), axis=None)
    cy = alt.Y("row:Q", scale=alt.Scale(domain=[h, 0], nice=False, zero=False), axis=None)
    whole = pd.DataFrame([{"col": 0, "row": 0, "c1": w, "r1": h, "url": data_url(picture)}])
    image = alt.Chart(whole).mark_image(aspect=False, aria=False).encode(x=cx, x2="c1:Q", y=cy, y2="r1:Q", url="url:N")
    frame = alt.Chart(patches).mark_rect(fillOpacity=0, stroke="#00ffff", strokeWidth=3, aria=False).encode(
        x=cx, x2="c1:Q", y=cy, y2="r1:Q").transform_filter({"param": "hover", "empty": False})
    photo = alt.layer(image, frame).properties(width=photo_side, height=photo_side, title=t("qkmap.hover_title"))
    # Vega's canvas renderer: many thousands of points draw in a fraction of SVG's time (bench/qkmap.py). Up to
    # SVG_POINTS they draw alike (docs/qk-map.md), and an SVG chart too wide for its column is scaled into it; a
    # canvas cannot be, so it puts the photo under the map, in a column as narrow as a 1024 px laptop's.
    canvas = len(qk.xy) > SVG_POINTS
    chart = alt.vconcat(plot, photo) if narrow or canvas else alt.hconcat(plot, photo)
    return configured(chart).properties(usermeta=CANVAS if canvas else SVG)


def points_plot(qk: qkmap.QKMap, values: np.ndarray, query: int, colour_title: str, side: int, narrow: bool):
    """The map itself, ``side`` px square: the points, the chosen query ringed, lines to its top keys. It
    defines the selections ``hover`` (the photo beside it reads it) and ``pick`` (a click)."""
    import altair as alt
    import pandas as pd

    p = qk.num_prefix_tokens
    labels = [token_label(int(i), p, qk.grid) for i in range(qk.num_tokens)]
    data = pd.DataFrame({
        "x": qk.xy[:, 0], "y": qk.xy[:, 1], "kind": qk.kind,
        "kind_label": np.where(qk.is_key, t("qkmap.key"), t("qkmap.query")),
        "token": qk.token, "label": [labels[i] for i in qk.token],
        "row": qk.row, "col": qk.column, "value": values,
    })
    data["spoken"] = data["kind_label"] + " · " + data["label"]  # what a screen reader says for a point
    x = alt.X("x:Q", axis=alt.Axis(title=t("qkmap.axis_1"), labels=False, ticks=False), scale=alt.Scale(zero=False))
    y = alt.Y("y:Q", axis=alt.Axis(title=t("qkmap.axis_2"), labels=False, ticks=False), scale=alt.Scale(zero=False))
    shape = alt.Shape("kind_label:N", scale=alt.Scale(domain=[t("qkmap.query"), t("qkmap.key")],
                                                      range=["circle", "square"]),
                      legend=alt.Legend(title=None, orient="top"))
    hover = alt.selection_point(name="hover", fields=["row", "col"], on="pointerover", clear="pointerout")
    pick = alt.selection_point(name="pick", fields=["kind", "token"], on="click", clear=False)
    tooltip = [alt.Tooltip("kind_label:N", title=t("qkmap.kind")), alt.Tooltip("label:N", title=t("qkmap.token")),
               alt.Tooltip("value:Q", title=colour_title, format=".3f")]
    points = alt.Chart(data[data["row"] >= 0]).mark_point(filled=True, size=30 if not narrow else 18,
                                                          opacity=0.8).encode(
        x=x, y=y, shape=shape, tooltip=tooltip, description="spoken:N",
        color=alt.Color("value:Q", scale=alt.Scale(scheme="viridis"),
                        legend=alt.Legend(title=colour_title, orient="bottom", gradientLength=min(side - 60, 260))),
    ).add_params(hover, pick)
    prefix = alt.Chart(data[data["row"] < 0]).mark_point(filled=True, size=110, color="#d62728", stroke="black",
                                                          strokeWidth=1).encode(x=x, y=y, shape=shape, tooltip=tooltip,
                                                                                  description="spoken:N")
    start = qk.index(0, query, key=False)
    ends = [qk.index(0, int(k), key=True) for k in qk.top_keys(0, query, TOP)]
    lines = pd.DataFrame({"x": [qk.xy[start, 0]] * TOP, "y": [qk.xy[start, 1]] * TOP,
                          "x2": qk.xy[ends, 0], "y2": qk.xy[ends, 1], "rank": range(1, TOP + 1)})
    top_lines = alt.Chart(lines).mark_rule(color="#ff00aa", strokeWidth=2).encode(x=x, y=y, x2="x2:Q", y2="y2:Q")
    chosen = alt.Chart(data.iloc[[start]]).mark_point(shape="circle", size=260, filled=False, color="#ff00aa",
                                                      strokeWidth=3).encode(x=x, y=y)
    table = pd.DataFrame({t("qkmap.kind"): data["kind_label"], t("qkmap.token"): data["label"],
                          t("qkmap.axis_1"): data["x"], t("qkmap.axis_2"): data["y"], colour_title: data["value"]})
    return alt.layer(table_layer(table), top_lines, points, prefix, chosen).properties(width=side, height=side)


def configured(chart):
    return chart.configure_view(strokeWidth=0).configure_legend(labelLimit=260)


def atlas_chart(picture, layers: int, heads: int, row_r: np.ndarray, column_r: np.ndarray, narrow: bool,
                chosen: tuple[int, int] = (0, 0)):
    """The atlas picture with one invisible clickable cell per head on top (layer down, head across)."""
    import altair as alt
    import pandas as pd

    cells = pd.DataFrame([(layer + 1, head + 1, head, layer, head + 1, layer + 1,
                           float(row_r[layer, head]), float(column_r[layer, head]))
                          for layer in range(layers) for head in range(heads)],
                         columns=["layer", "head", "c0", "r0", "c1", "r1", "row_r", "column_r"])
    width = min(picture.width, NARROW_PX if narrow else 520)
    height = width * picture.height / picture.width
    x = alt.X("c0:Q", scale=alt.Scale(domain=[0, heads], nice=False, zero=False),
              axis=alt.Axis(title=t("view.head"), values=[i + 0.5 for i in range(heads)],
                            labelExpr="round(datum.value + 0.5)", orient="top", grid=False))
    y = alt.Y("r0:Q", scale=alt.Scale(domain=[layers, 0], nice=False, zero=False),
              axis=alt.Axis(title=t("view.layer"), values=[i + 0.5 for i in range(layers)],
                            labelExpr="round(datum.value + 0.5)", grid=False,
                            titleAngle=0, titleAnchor="start", titleAlign="right", titleY=-30))  # 層 upright
    whole = pd.DataFrame([{"c0": 0, "r0": 0, "c1": heads, "r1": layers, "url": data_url(picture)}])
    image = alt.Chart(whole).mark_image(aspect=False, aria=False).encode(x=x, x2="c1:Q", y=y, y2="r1:Q", url="url:N")
    tile = alt.selection_point(name="tile", fields=["layer", "head"], on="click", clear=False)
    hover = alt.selection_point(name="atlas_hover", fields=["layer", "head"], on="pointerover", clear="pointerout")
    tooltip = [alt.Tooltip("layer:Q", title=t("view.layer")), alt.Tooltip("head:Q", title=t("view.head")),
               alt.Tooltip("row_r:Q", title=t("qkmap.row_r"), format=".2f"),
               alt.Tooltip("column_r:Q", title=t("qkmap.column_r"), format=".2f")]
    grid = alt.Chart(cells.assign(label=[f"{t('view.layer')} {layer}, {t('view.head_n', n=head)}"
                                         for layer, head in zip(cells["layer"], cells["head"])])).mark_rect(
        fill="white", fillOpacity=0.01, stroke="#ff00aa", strokeWidth=2).encode(
        x=x, x2="c1:Q", y=y, y2="r1:Q", description="label:N",
        strokeOpacity=alt.condition(hover, alt.value(1.0), alt.value(0.0), empty=False),
        tooltip=tooltip,
    ).add_params(tile, hover)
    layer, head = chosen
    here = alt.Chart(pd.DataFrame([{"c0": head, "r0": layer, "c1": head + 1, "r1": layer + 1}])).mark_rect(
        fillOpacity=0, stroke="#ff00aa", strokeWidth=3).encode(x=x, x2="c1:Q", y=y, y2="r1:Q")
    return alt.layer(table_layer(tooltip_table(cells, tooltip)), image, here, grid).properties(
        width=width, height=height, usermeta=CANVAS).configure_view(
        strokeWidth=0)


def show(ctx: Context) -> None:
    cap = ctx.cap
    head = _head(ctx)
    title = t("qkmap.title", layer=ctx.layer + 1, head=head + 1)
    st.subheader(title)
    if not ctx.present:  # a projector keeps the room for the map
        st.caption(t("qkmap.explain", dk=cap.layout(ctx.layer).head_dim))
    for spec in LINKED:
        spec.prepare(st.session_state, ctx)
    c1, c2, c3 = st.columns(3)
    method = c1.selectbox(t("qkmap.method"), qkmap.METHODS, key="qk_method", placeholder=t("classroom.choose"),
                          format_func=lambda m: t(f"qkmap.method_{m}"))
    normalize = c2.selectbox(t("qkmap.normalize"), qkmap.NORMALIZATIONS, key="qk_normalize",
                             placeholder=t("classroom.choose"), format_func=lambda m: t(f"qkmap.normalize_{m}"))
    colour = c3.selectbox(t("qkmap.colour_by"), COLOUR_CHOICES, key="qk_colour", placeholder=t("classroom.choose"),
                          format_func=lambda c: t(f"qkmap.colour_{c}"))
    if method != "pca" and not qkmap.available(method):
        st.warning(t(f"qkmap.missing_{method}"), icon=":material/extension:")
        method = "pca"
    compute = lambda: qkmap.qk_map(cap, ctx.layer, head, method, normalize)  # noqa: E731
    if method == "pca":
        qk = compute()  # a few ms: no queue
    else:
        qk = heavy.run("qkmap", ctx.cap_key, (ctx.layer, head, method, normalize), compute, t("qkmap.working"))
    stats = qkmap.statistics(qk)
    values = qkmap.colour_values(qk, cap, colour)
    lay = cap.layout(ctx.layer)
    prefix, grid = lay.prefix, lay.grid
    query = current_query(cap, ctx.layer)  # the session's query token, as the Query and matrix views draw it
    if colour in ("row", "column"):
        values = values + 1  # counted from 1, as the page counts rows and columns
    colour_title = t(f"qkmap.colour_{colour}")
    chart = scatter(qk, values, ctx.view, query, colour_title, ctx.narrow, ctx.present)
    st.altair_chart(described(chart), key=CHART_KEY, on_select=partial(_picked_point, prefix, grid),
                    selection_mode="pick", width="content", alt=title)
    # the file: the map alone (the photo beside it only shows the patch under the pointer)
    download_chart(configured(points_plot(qk, values, query, colour_title, SCATTER_PX, False)),
                   f"qk_map_layer{ctx.layer + 1}_head{head + 1}_{method}", key="qk_map_download")
    st.markdown(measured_sentence(stats, ctx.layer, head))
    top = listed(token_label(int(k), prefix, grid) for k in qk.top_keys(0, query, TOP))
    st.markdown(t("qkmap.lines", query=token_label(query, prefix, grid), top=top, n=TOP))
    st.button(t("qkmap.open_query"), key="qk_open_query", on_click=_open_query_view, icon=":material/ads_click:")
    if normalize == "attentionviz":
        st.caption(t("qkmap.normalize_note", change=softmax_change(cap, ctx.layer, head, qk)))
    else:
        st.caption(t("qkmap.none_note"))

    atlas_title = t("qkmap.atlas_title", layers=cap.num_layers, heads=cap.num_heads)
    st.subheader(atlas_title)
    if not cap.uniform or not all(map(qkmap.mappable, [cap] * cap.num_layers, range(cap.num_layers))):
        st.info(t("qkmap.atlas_one_grid"))  # the atlas lays every head on the same tokens
        return
    st.caption(t("qkmap.atlas_explain"))
    at, picture = heavy.run("qk_atlas", ctx.cap_key, (), lambda: _atlas(cap), t("qkmap.working"))
    atlas = atlas_chart(picture, cap.num_layers, cap.num_heads, at.row_r, at.column_r, ctx.narrow, (ctx.layer, head))
    st.altair_chart(described(atlas), key=ATLAS_KEY, on_select=_picked_head, selection_mode="tile", width="content",
                    alt=atlas_title)
    download_chart(atlas, "qk_atlas", key="qk_atlas_download")
    strongest = np.unravel_index(np.argmax(np.maximum(at.row_r, at.column_r)), at.row_r.shape)
    weakest = np.unravel_index(np.argmin(np.maximum(at.row_r, at.column_r)), at.row_r.shape)
    st.markdown(t("qkmap.atlas_sentence",
                  strong_layer=strongest[0] + 1, strong_head=strongest[1] + 1,
                  strong=float(max(at.row_r[strongest], at.column_r[strongest])),
                  weak_layer=weakest[0] + 1, weak_head=weakest[1] + 1,
                  weak=float(max(at.row_r[weakest], at.column_r[weakest])),
                  positional=int((np.maximum(at.row_r, at.column_r) >= 0.7).sum()), total=at.row_r.size))


def _atlas(cap):
    at = qkmap.atlas(cap)
    return at, qkmap.atlas_picture(at)


def how_it_attends(cap, layer: int) -> str:
    """What keeps layer ``layer`` from being one set of points that attend to each other, in a few words."""
    key, values = qkmap.obstacle(cap, layer)
    return t(f"qkmap.how_{key}", **values)


def needs(ctx: Context) -> str | None:
    """A layer whose queries and keys are one set of tokens attending to each other (not windows, not pooled keys)."""
    if qkmap.mappable(ctx.cap, ctx.layer):
        return None
    cap = ctx.cap
    layers = [layer + 1 for layer in range(cap.num_layers) if qkmap.mappable(cap, layer)]
    how = how_it_attends(cap, ctx.layer)
    if not layers:
        everyone = [layer + 1 for layer in range(cap.num_layers) if cap.layout(layer).is_global]
        if everyone:  # every token attends to every token there, but the heads' logits are mixed (talking heads)
            runs = [[everyone[0], everyone[0]]]  # consecutive layers as first–last
            for n in everyone[1:]:
                if n == runs[-1][1] + 1:
                    runs[-1][1] = n
                else:
                    runs.append([n, n])
            return t("qkmap.no_plain_layer", layer=ctx.layer + 1, how=how,
                     layers=listed(f"{a}–{b}" if b > a else str(a) for a, b in runs))
        return t("qkmap.no_global_layer", layer=ctx.layer + 1, how=how)
    return t("qkmap.not_global", layer=ctx.layer + 1, how=how,
             layers=listed(layers[:6]) + ("…" if len(layers) > 6 else ""))


register(View("qkmap", show, controls=frozenset({LAYER, HEAD}), order=91, reads_query=True, linked=LINKED,
              needs=needs))
