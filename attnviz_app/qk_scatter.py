"""A WebGL scatter for Q/K maps too large for Vega's canvas: the Dataset page's ~79 000 points (issue #21).

The browser side is ``qk_scatter.js`` (plain JavaScript and raw WebGL, shipped with the package, nothing
downloaded): all points in one ``gl.POINTS`` draw, circles for queries and squares for keys, pan by drag,
zoom by wheel or pinch, a tooltip found through a grid index. It is mounted with Streamlit's components v2
API (no iframe). This side only packs the points: every colour is computed here, with the kinds of scale
the Altair chart has (ten categorical colours in turn per photo: matplotlib's tab10, where Vega used its
tableau10; viridis for values), so the picture is fixed by :func:`payload` and a test can check every point.
"""
from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Callable, Sequence
from importlib import resources

import matplotlib
import numpy as np
import streamlit as st

from attnviz import qkmap, render

from .text import t

# One point: its 2-D place, its colour, query (0) or key (1), and which photo and token for the tooltip.
RECORD = np.dtype([("x", "<f4"), ("y", "<f4"), ("rgb", "u1", 3), ("kind", "u1"), ("photo", "<u2"), ("token", "<u2")])
NO_VALUE = (158, 158, 158)  # a point with no value to colour by (the class token's patch row): grey
PHOTO_COLOURS = (np.asarray(matplotlib.colormaps["tab10"].colors) * 255 + 0.5).astype(np.uint8)  # (10, 3)
LEGEND_PHOTOS = 10  # photos named in the legend; the colours repeat after ten anyway
STOPS = 11  # colours of the viridis ramp in the legend
MARGIN = 0.04  # the first view shows the points' box and this fraction of its width and height on each side


def colours(values: np.ndarray, categorical: bool) -> np.ndarray:
    """(P, 3) uint8: point ``i``'s colour. ``categorical``: ``values`` are photo numbers, coloured in turn by
    tab10's ten colours; else viridis from the smallest finite value to the largest, grey where NaN."""
    if categorical:
        return PHOTO_COLOURS[values.astype(np.intp) % len(PHOTO_COLOURS)]
    finite = np.isfinite(values)
    rgb = np.empty((len(values), 3), np.uint8)
    rgb[~finite] = NO_VALUE
    if finite.any():
        rgb[finite] = render.colorize(render.normalise(values[finite]), "viridis")
    return rgb


def records(qk: qkmap.QKMap, rgb: np.ndarray) -> np.ndarray:
    """(P,) ``RECORD``: the map's points in its own order (photo by photo, queries then keys)."""
    if qk.num_photos > 65535 or qk.num_tokens > 65535:
        raise ValueError("the scatter's records hold photo and token numbers below 65 536")
    points = np.empty(len(qk.token), RECORD)
    points["x"], points["y"] = qk.xy[:, 0], qk.xy[:, 1]
    points["rgb"] = rgb
    points["kind"] = qk.is_key
    points["photo"], points["token"] = qk.photo, qk.token
    return points


def words() -> dict[str, str]:
    """The scatter's words in this session's language."""
    return {"query": t("qkmap.query"), "key": t("qkmap.key"), "kind": t("qkmap.kind"), "token": t("qkmap.token"),
            "photo": t("qkmap.colour_photo"), "axis_1": t("qkmap.axis_1"), "axis_2": t("qkmap.axis_2"),
            "no_webgl": t("qkmap.no_webgl")}


def legend(values: np.ndarray, names: Sequence[str], title: str, categorical: bool) -> dict:
    """The colour legend: the first photos' colours, or the viridis ramp with its two ends."""
    shown: dict = {"title": title}
    if categorical:
        count = min(len(names), LEGEND_PHOTOS)
        shown["entries"] = [[names[i], "#%02x%02x%02x" % tuple(PHOTO_COLOURS[i])] for i in range(count)]
        if len(names) > count:
            shown["more"] = t("qkmap.legend_more", count=len(names) - count)
        return shown
    finite = values[np.isfinite(values)]
    ramp = render.colorize(np.linspace(0.0, 1.0, STOPS), "viridis")
    shown["stops"] = ["#%02x%02x%02x" % tuple(c) for c in ramp]
    shown["lo"], shown["hi"] = (f"{finite.min():.3g}", f"{finite.max():.3g}") if finite.size else ("", "")
    if finite.size < values.size:
        shown["none"], shown["none_colour"] = t("qkmap.legend_none"), "#%02x%02x%02x" % NO_VALUE
    return shown


def payload(qk: qkmap.QKMap, values: np.ndarray, names: Sequence[str], labels: Sequence[str], title: str,
            categorical: bool, text: dict[str, str]) -> bytes:
    """What ``qk_scatter.js`` reads: a u32 length, that many bytes of JSON (``text``: :func:`words`; the
    photo ``names``; the token ``labels``; the legend), zeros up to a multiple of 16, then the records."""
    points = records(qk, colours(values, categorical))
    places = qk.xy.astype("<f4").tobytes()
    head = json.dumps({
        "id": hashlib.blake2b(places, digest_size=8).hexdigest(),  # same places: the browser keeps its pan and zoom
        "words": text, "names": list(names), "labels": list(labels),
        "legend": legend(values, names, title, categorical), "margin": MARGIN,
    }, ensure_ascii=False).encode()
    start = -(-(4 + len(head)) // RECORD.itemsize) * RECORD.itemsize
    return struct.pack("<I", len(head)) + head + bytes(start - 4 - len(head)) + points.tobytes()


def unpack(data: bytes) -> tuple[dict, np.ndarray]:
    """The header and records of a :func:`payload`, read as ``qk_scatter.js`` reads them."""
    (n,) = struct.unpack_from("<I", data)
    start = -(-(4 + n) // RECORD.itemsize) * RECORD.itemsize
    return json.loads(data[4:4 + n]), np.frombuffer(data[start:], RECORD)


@functools.cache
def _component():
    files = resources.files("attnviz_app")
    return st.components.v2.component("attnviz_qk_scatter", js=(files / "qk_scatter.js").read_text(encoding="utf-8"),
                                      css=(files / "qk_scatter.css").read_text(encoding="utf-8"), isolate_styles=False)


def show(data: bytes, key: str, fallback: Callable[[], None]) -> None:
    """Mount the scatter of ``data`` (a :func:`payload`). A browser without WebGL says so to the server once;
    from then on this session gets one line that says so and ``fallback()`` (the Altair chart)."""
    flag = f"{key}_no_webgl"
    if st.session_state.get(flag):
        st.caption(t("qkmap.no_webgl"))
        fallback()
        return

    def no_webgl() -> None:
        st.session_state[flag] = True

    _component()(key=key, data=data, width="stretch", height="content", on_no_webgl_change=no_webgl)
