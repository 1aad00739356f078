"""Per-head statistics by layer: mean attention distance, CLS entropy, prefix share."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from attnviz.stats import HeadStats, depth_trend, head_stats
from .. import heavy
from ..text import t

from .base import Context, View, register
from .common import described, download_chart, download_file, figure_png, table_layer, tooltip_table

PANELS = ("distance", "entropy", "prefix")
STEMS = {"distance": "head_mean_attention_distance", "entropy": "head_cls_entropy", "prefix": "head_prefix_share"}


def table(stats: HeadStats) -> pd.DataFrame:
    """Long form: one row per (layer, head), layers and heads 1-based."""
    num_layers, num_heads = stats.entropy.shape
    return pd.DataFrame([
        {"layer": l + 1, "head": k + 1, "distance": stats.distance[l, k], "entropy": stats.entropy[l, k],
         "prefix": 100 * stats.prefix_share[l, k]}
        for l in range(num_layers) for k in range(num_heads)
    ])


def panel(
    data: pd.DataFrame, field: str, axis_title: str, reference: float | None = None, reference_label: str = ""
) -> alt.Chart:
    """Dots per head over layers, and the mean of the heads as a black line."""
    x = alt.X("layer:Q", title=t("analysis.stats.layer_axis"), axis=alt.Axis(tickMinStep=1, format="d"),
              scale=alt.Scale(domain=[0.5, data["layer"].max() + 0.5], nice=False))
    y = alt.Y(f"{field}:Q", title=axis_title)
    tooltip = [alt.Tooltip("layer:Q", title=t("analysis.stats.layer_axis")),
               alt.Tooltip("head:N", title=t("analysis.stats.head_legend")),
               alt.Tooltip(f"{field}:Q", format=".2f", title=axis_title)]
    dots = alt.Chart(data).mark_circle(size=70, opacity=0.85).encode(
        x=x, y=y, color=alt.Color("head:N", title=t("analysis.stats.head_legend"), scale=alt.Scale(scheme="tableau10")),
        tooltip=tooltip,
    )
    mean = alt.Chart(data).mark_line(color="black", strokeWidth=2).encode(x=x, y=f"mean({field}):Q")
    layers = [table_layer(tooltip_table(data, tooltip)), dots, mean]
    if reference is not None:
        rule = pd.DataFrame([{"y": reference, "label": reference_label}])
        layers.append(alt.Chart(rule).mark_rule(strokeDash=[6, 4], color="gray").encode(y="y:Q"))
        layers.append(alt.Chart(rule).mark_text(align="left", dx=4, dy=-7, color="gray").encode(
            y="y:Q", x=alt.value(0), text="label:N"))
    return alt.layer(*layers).properties(height=260)


def export_figure(
    data: pd.DataFrame, stats: HeadStats, titles: dict[str, str], axes: dict[str, str], words: dict[str, str]
):
    """The three panels as one matplotlib figure. Runs when the download is clicked, outside the
    script run, so every word is passed in already translated."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.2))
    axs = fig.subplots(1, 3)
    for ax, field in zip(axs, PANELS):
        for head, part in data.groupby("head"):
            ax.scatter(part["layer"], part[field], s=22, label=f"{words['head']} {head}")
        means = data.groupby("layer")[field].mean()
        ax.plot(means.index, means.values, color="black", lw=2, label=words["mean"])
        if field in ("entropy", "distance"):
            level = stats.max_entropy if field == "entropy" else stats.uniform_distance
            ax.axhline(level, color="gray", ls="--", lw=1, label=words["uniform"])
        ax.set_title(titles[field], fontsize=10)
        ax.set_xlabel(words["layer"])
        ax.set_ylabel(axes[field], fontsize=9)
    axs[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def trend_sentence(stats: HeadStats) -> str:
    """This capture's distance panel in words: every number one the panel shows (depth_trend)."""
    trend = depth_trend(stats)
    (ll, lh, ld), (fl, fh, fd) = trend.local, trend.far
    said = t("analysis.stats.trend_heads", ll=ll + 1, lh=lh + 1, ld=ld, lp=ld / stats.patch_px, fl=fl + 1, fh=fh + 1,
             fd=fd, uniform=stats.uniform_distance)
    if trend.half:
        first, second = round(trend.first_half), round(trend.second_half)  # as the sentence shows them
        way = "farther" if second > first else "nearer" if second < first else "same"
        said += " " + t("analysis.stats.trend_halves", mid=trend.half, mid1=trend.half + 1, last=trend.num_layers,
                        first=first, second=second, direction=t(f"analysis.stats.trend_{way}"))
    return said


def show(ctx: Context) -> None:
    cap = ctx.cap
    # ~1.6 s at 518 px: shared and bounded across sessions
    stats = heavy.run("stats", ctx.cap_key, (), lambda: head_stats(cap), t("jobs.stats"))
    data = table(stats)
    st.subheader(t("analysis.stats.title"))
    st.markdown(t("analysis.stats.explain"))
    st.info(trend_sentence(stats))
    titles = {f: t(f"analysis.stats.{f}_title", size=ctx.model.size) for f in PANELS}
    axes = {
        "distance": t("analysis.stats.distance_axis"),
        "entropy": t("analysis.stats.entropy_axis"),
        "prefix": t("analysis.stats.prefix_axis"),
    }
    helps = {
        "distance": t("analysis.stats.distance_help", patch=stats.patch_px, uniform=stats.uniform_distance),
        "entropy": t("analysis.stats.entropy_help", max=stats.max_entropy, n=stats.num_tokens),
        "prefix": t("analysis.stats.prefix_help"),
    }
    left, right = st.columns(2, gap="large")
    for column, field in ((left, "distance"), (right, "entropy"), (left, "prefix")):
        with column:
            st.markdown(f"**{titles[field]}**")
            reference = {"entropy": stats.max_entropy, "distance": stats.uniform_distance}.get(field)
            label = t(f"analysis.stats.uniform_{field}") if reference else ""
            chart = panel(data, field, axes[field], reference, label)
            st.altair_chart(described(chart), width="stretch")
            st.caption(helps[field])
            # the file carries the panel's title, which the page writes above the chart
            download_chart(chart.properties(title=titles[field]), STEMS[field], key=f"stats_{field}")
    with right:
        words = {w: t(f"analysis.stats.{k}") for w, k in
                 (("head", "head_legend"), ("mean", "mean_legend"), ("uniform", "uniform"), ("layer", "layer_axis"))}
        download_file(
            lambda: figure_png(export_figure(data, stats, titles, axes, words)), "head_statistics.png",
            key="download_stats", label=t("analysis.stats.download_all"),
        )


register(View("stats", show, order=70, no_layer_head="classroom.no_layer_head_stats"))  # every layer and head at once: no shared control
