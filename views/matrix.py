"""The full N × N attention matrix of one layer and head, with the selected query row highlighted."""
from __future__ import annotations

import io

import numpy as np
import streamlit as st

from ui import t

from . import Context
from .common import QUERY_COLOUR, download_file, figure_png, head_label, head_part, token_label
from .query import current_query, set_query

MAX_TICKS = 16  # patch-row ticks on each axis; more would overlap at 518 px (37 rows)


def _ticks(cap) -> tuple[list[int], list[str]]:
    """Tick positions and labels: every prefix token, then the first patch of every k-th patch row."""
    h, w = cap.grid
    prefix = cap.num_prefix_tokens
    step = max(1, -(-h // MAX_TICKS))
    at = [*range(prefix), *(prefix + r * w for r in range(0, h, step))]
    return at, [token_label(i, prefix, cap.grid, short=True) for i in at]


def matrix_figure(cap, weights: np.ndarray, query: int, cmap: str, log: bool, title: str):
    """Heatmap of ``weights`` (N, N) with labelled axes, a colour bar and the ``query`` row framed."""
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    n = weights.shape[0]
    prefix = cap.num_prefix_tokens
    norm = LogNorm(vmin=max(float(weights[weights > 0].min()), 1e-6), vmax=float(weights.max())) if log else (
        Normalize(vmin=0.0, vmax=float(weights.max()))
    )
    fig = Figure(figsize=(8.4, 7.2))
    ax = fig.subplots()
    image = ax.imshow(np.maximum(weights, 1e-12) if log else weights, cmap=cmap, norm=norm, interpolation="nearest")
    at, labels = _ticks(cap)
    ax.set_xticks(at, labels, rotation=90, fontsize=7)
    ax.set_yticks(at, labels, fontsize=7)
    ax.set_xlabel(t("analysis.matrix.cols"))
    ax.set_ylabel(t("analysis.matrix.rows"))
    for edge in (prefix - 0.5,):  # prefix tokens | patches
        ax.axhline(edge, color="white", lw=0.8)
        ax.axvline(edge, color="white", lw=0.8)
    colour = tuple(c / 255 for c in QUERY_COLOUR)
    ax.add_patch(Rectangle((-0.5, query - 0.5), n, 1, fill=False, edgecolor=colour, lw=1.6))
    ax.annotate("▶", (-0.5, query), xytext=(-6, 0), textcoords="offset points", color=colour,
                ha="right", va="center", fontsize=10, annotation_clip=False)
    ax.set_title(title, fontsize=11)
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
    bar.set_label(t("analysis.matrix.colorbar"))
    return fig


def npz_bytes(cap) -> bytes:
    """The whole capture as a compressed .npz (same arrays as the CLI's export)."""
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer, attention=cap.all_weights(), input=cap.input.cpu().numpy(), grid=np.array(cap.grid),
        num_prefix_tokens=np.array(cap.num_prefix_tokens),
    )
    return buffer.getvalue()


def show(ctx: Context) -> None:
    cap = ctx.cap
    prefix, n = cap.num_prefix_tokens, cap.num_tokens
    st.subheader(t("analysis.matrix.title", layer=ctx.layer + 1, head=head_label(ctx.head), n=n))
    pick, scale = st.columns([3, 2])
    st.session_state["matrix_query"] = current_query(cap)  # follows the query view's choice
    query = pick.selectbox(
        t("analysis.matrix.query"), range(n), key="matrix_query",
        format_func=lambda i: token_label(i, prefix, cap.grid),
        on_change=lambda: set_query(cap, st.session_state["matrix_query"]),
    )
    log = scale.toggle(t("analysis.matrix.log"), value=True, key="matrix_log", help=t("analysis.matrix.log_help"))
    weights = cap.weights(ctx.layer, ctx.head)  # (N, N)
    title = t("analysis.matrix.title", layer=ctx.layer + 1, head=head_label(ctx.head), n=n)
    png = figure_png(matrix_figure(cap, weights, query, ctx.cmap, log, title))
    st.image(png, caption=t("analysis.matrix.caption"))
    download_file(png, f"matrix_layer{ctx.layer + 1}_head{head_part(ctx.head)}.png", key="download_matrix")

    st.markdown("**" + t("analysis.matrix.row_title", token=token_label(query, prefix, cap.grid)) + "**")
    st.bar_chart(
        {t("analysis.matrix.colorbar"): weights[query]}, x_label=t("analysis.matrix.cols"),
        y_label=t("analysis.matrix.colorbar"), height=180,
    )
    download_file(
        lambda: npz_bytes(cap), "attention_capture.npz", key="download_npz", mime="application/octet-stream",
        label=t("analysis.download_npz"), help=t("analysis.npz_help"),
    )
