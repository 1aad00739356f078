"""The full N × N attention matrix of one layer and head, with the selected query row highlighted."""
from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz import export
from ..text import t

from .base import COLOURS, Context, HEAD, LAYER, Linked, View, flag, register, write_flag
from .common import QUERY_COLOUR, download_file, figure_png, head_label, head_part, token_label
from .query import current_query, set_query
from .stages import matrix as windowed_matrix

MAX_TICKS = 16  # patch-row ticks on each axis; more would overlap at 518 px (37 rows)
FIGURE_PX = 700  # about how many pixels the matrix spans in the figure
LOG = Linked("log", "matrix_log", flag, lambda ctx: True, write_flag)


def _ticks(lay) -> tuple[list[float], list[str], list[float]]:
    """Tick positions and labels (the prefix block, then the centre of every k-th patch row) and the
    boundaries between patch rows. Labels closer than ~14 px to the prefix block are left out."""
    h, w = lay.grid
    prefix, n = lay.prefix, lay.num_tokens  # the layer's one window of every token
    first = t("analysis.cls_token") if prefix == 1 else t("analysis.matrix.prefix_tick", k=prefix - 1)
    at, labels = [(prefix - 1) / 2], [first]
    step = max(1, -(-h // MAX_TICKS))
    for r in range(0, h, step):
        centre = prefix + r * w + (w - 1) / 2
        if (centre - at[0]) * FIGURE_PX / n >= 14:
            at.append(centre)
            labels.append(t("analysis.matrix.row_tick", r=r + 1))
    return at, labels, [prefix + r * w - 0.5 for r in range(1, h)]


def matrix_figure(lay, weights: np.ndarray, query: int, cmap: str, log: bool):
    """Heatmap of ``weights`` (N, N) with labelled axes, a colour bar and the ``query`` row framed."""
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    n = weights.shape[0]
    prefix = lay.prefix
    norm = LogNorm(vmin=max(float(weights[weights > 0].min()), 1e-6), vmax=float(weights.max())) if log else (
        Normalize(vmin=0.0, vmax=float(weights.max()))
    )
    fig = Figure(figsize=(8.4, 7.2))
    ax = fig.subplots()
    image = ax.imshow(np.maximum(weights, 1e-12) if log else weights, cmap=cmap, norm=norm, interpolation="nearest")
    at, labels, rows = _ticks(lay)
    ax.set_xticks(at, labels, rotation=90, fontsize=8)
    ax.set_yticks(at, labels, fontsize=8)
    ax.set_xticks(rows, minor=True)
    ax.set_yticks(rows, minor=True)
    ax.tick_params(which="minor", length=3)
    ax.tick_params(which="major", length=0)
    ax.set_xlabel(t("analysis.matrix.cols"))
    ax.set_ylabel(t("analysis.matrix.rows"))
    ax.axhline(prefix - 0.5, color="white", lw=1.0)  # prefix tokens | patches
    ax.axvline(prefix - 0.5, color="white", lw=1.0)
    colour = tuple(c / 255 for c in QUERY_COLOUR)
    pad = max(0.5, n / 250)  # frame the row with a little room so its own colours stay visible
    for edge, lw in (("black", 3.2), (colour, 1.8)):
        frame = Rectangle((-0.5, query - 0.5 - pad), n, 1 + 2 * pad, fill=False, edgecolor=edge, lw=lw, clip_on=False)
        ax.add_patch(frame)
    ax.annotate("◀", (n - 0.5, query), xytext=(3, 0), textcoords="offset points", color="black",
                ha="left", va="center", fontsize=12, annotation_clip=False)
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.05)
    bar.set_label(t("analysis.matrix.colorbar"))
    return fig


def npz_bytes(cap, model=None) -> bytes:
    """The whole capture as the CLI's ``--format full`` export (``attnviz.load_capture`` reads it back); where the
    layers differ (a Swin's whole-image matrices are 3 × 3136² at 224 px) the compact ``qk`` form, from which
    every weight is recomputed."""
    about = export.describe(model, cap) if model is not None else None
    return export.capture_bytes(cap, format="full" if cap.uniform else "qk", about=about,
                                labels=model.labels if model is not None else None)


def show(ctx: Context) -> None:
    cap = ctx.cap
    lay = cap.layout(ctx.layer)
    if not lay.is_global:  # windows or pooled keys: the matrix in window order, block-diagonal, bounded in size
        stage, block = lay.stage, lay.block
        names = dict(stage=stage + 1, block=block + 1, head=head_label(ctx.head))
        windowed_matrix(cap, ctx.layer, ctx.head, ctx.cmap, names, stage, block, 358 if ctx.narrow else 640)
        npz_download(ctx)
        return
    prefix, n, grid = lay.prefix, lay.num_tokens, lay.grid  # the widgets' functions hold these, not cap
    st.subheader(t("analysis.matrix.title", layer=ctx.layer + 1, head=head_label(ctx.head), n=n))
    pick, scale = st.columns([3, 2])
    st.session_state["matrix_query"] = current_query(cap, ctx.layer)  # follows the query view's choice
    query = pick.selectbox(
        t("analysis.matrix.query"), range(n), key="matrix_query", placeholder=t("classroom.choose"),
        format_func=lambda i: token_label(i, prefix, grid),
        on_change=lambda: set_query(prefix, grid, st.session_state["matrix_query"]),
    )
    LOG.prepare(st.session_state, ctx)
    log = scale.toggle(t("analysis.matrix.log"), key="matrix_log", help=t("analysis.matrix.log_help"))
    weights = cap.weights(ctx.layer, ctx.head)  # (N, N)
    png = figure_png(matrix_figure(lay, weights, query, ctx.cmap, log))
    st.image(png, caption=t("analysis.matrix.caption"))
    download_file(png, f"matrix_layer{ctx.layer + 1}_head{head_part(ctx.head)}.png", key="download_matrix")
    npz_download(ctx)


def npz_download(ctx: Context) -> None:
    """The whole capture as an NPZ, built when clicked (a Swin's full export is ~300 MB: the compact form)."""
    capture, _ = ctx.later()
    model = ctx.model
    download_file(
        lambda: npz_bytes(capture(), model), "attention_capture.npz", key="download_npz", mime="application/octet-stream",
        label=t("analysis.download_npz"), help=t("analysis.npz_help"),
    )


register(View("matrix", show, controls=frozenset({LAYER, HEAD, COLOURS}), order=30, reads_query=True,
              linked=(LOG,), beginner=True))  # the N × N softmax itself: what a lesson's formula makes
