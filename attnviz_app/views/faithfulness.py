"""Does attention explain? Every map's deletion and insertion curves on this photo (attnviz.faithfulness)."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from attnviz import faithfulness as fa
from attnviz.errors import FaithfulnessError
from .. import heavy
from ..text import t

from .base import Context, Linked, View, flag, one_of, register, write_flag
from .common import described, download_chart, escape_markdown, markdown_table, table_layer

KIND = "faithfulness"


def lang() -> str:
    return st.session_state.get("lang") or "en"


def fills_for(model) -> tuple[list[str], str | None]:
    """The fills this model can take, and the sentence saying why token removal is not among them."""
    try:
        fa.check_fill(model, "token")
        return list(fa.FILLS), None
    except FaithfulnessError as error:
        return [f for f in fa.FILLS if f != "token"], str(error)


def measure_or_wait(model, cap, cap_key: tuple, fill: str, heads: bool, prefix: str) -> fa.Faithfulness | None:
    """The result for these settings: from the shared cache, or run after a press of the button (with a
    progress bar and a Cancel); None while nothing was asked."""
    args = (fill, heads)
    asked = (cap_key, fill, heads)
    if heavy.cached(KIND, cap_key, args):
        st.session_state[f"{prefix}_asked"] = asked
    buttons = st.columns([2, 1, 3])
    if buttons[0].button(t("faith_page.run"), key=f"{prefix}_run", type="primary"):
        st.session_state[f"{prefix}_asked"] = asked
    if st.session_state.get(f"{prefix}_asked") != asked:
        maps = fa.map_count(model, cap, heads=heads)
        st.caption(t("faith_page.press", steps=2 * (fa.STEPS - 1), each=fa.STEPS - 1, maps=maps,
                     passes=fa.planned_inputs(maps)))
        return None
    slot = buttons[1].empty()  # the Cancel button, only while the run is on
    if not heavy.cached(KIND, cap_key, args) and slot.button(t("faith_page.cancel"), key=f"{prefix}_cancel"):
        heavy.cancel(KIND, cap_key, args)
        st.session_state.pop(f"{prefix}_asked", None)
        st.info(t("faith_page.cancelled"))
        return None
    bar = heavy.progress(KIND, cap_key, args)
    try:
        result = heavy.run(KIND, cap_key, args,
                           lambda: fa.faithfulness(model, cap, fill=fill, heads=heads, progress=bar),
                           t("faith_page.running"), bar=bar)
        slot.empty()
        return result
    except heavy.Cancelled:
        st.session_state.pop(f"{prefix}_asked", None)
        st.info(t("faith_page.cancelled"))
        return None


def curves_chart(result: fa.Faithfulness, narrow: bool = False) -> alt.Chart:
    """Deletion and insertion side by side; the random orders as a grey band (mean ± standard deviation)."""
    percent = 100 * result.removed / result.num_patches
    which = {"deletion": t("faith_page.deletion"), "insertion": t("faith_page.insertion")}
    lines, bands = [], []
    for curve in result.curves:
        name = fa.map_name(curve.ranking, lang())
        for key, values in (("deletion", curve.deletion), ("insertion", curve.insertion)):
            lines += [{"percent": p, "value": v, "map": name, "curve": which[key]} for p, v in zip(percent, values)]
    for key in ("deletion", "insertion"):
        stack = np.stack([getattr(c, key) for c in result.random])  # (R, steps + 1)
        mean, spread = stack.mean(0), stack.std(0, ddof=1)
        bands += [{"percent": p, "mean": m, "lo": m - s, "hi": m + s, "curve": which[key]}
                  for p, m, s in zip(percent, mean, spread)]
    pick = alt.selection_point(fields=["map"], bind="legend")
    x = alt.X("percent:Q", title=t("faith_page.percent_axis"), scale=alt.Scale(domain=[0, 100]))
    y_title = t(f"faith_page.axis_{result.measure}")
    lines, bands = pd.DataFrame(lines), pd.DataFrame(bands)
    width = 250 if narrow else 330  # two panels and their axes inside the page's column (358 px on a phone)
    names = [fa.map_name(c.ranking, lang()) for c in result.curves]  # legend in the table's order of kinds
    shown = pd.DataFrame([{t("faith_page.map"): fa.map_name(c.ranking, lang()), t("faith_page.percent_axis"): p,
                           t("faith_page.deletion_short"): d, t("faith_page.insertion_short"): i}
                          for c in (*result.curves, *result.random)
                          for p, d, i in zip(percent, c.deletion, c.insertion)])
    panels = []
    for key in ("deletion", "insertion"):
        band_data, line_data = bands[bands["curve"] == which[key]], lines[lines["curve"] == which[key]]
        band = alt.Chart(band_data).mark_area(opacity=0.25, color="#7f7f7f").encode(x=x, y="lo:Q", y2="hi:Q")
        mean = alt.Chart(band_data).mark_line(color="#555555", strokeDash=[4, 3]).encode(
            x=x, y="mean:Q", tooltip=[alt.Tooltip("mean:Q", format=".3f", title=t("faith_page.random_mean"))])
        maps = alt.Chart(line_data).mark_line(point=alt.OverlayMarkDef(size=18)).encode(
            x=x, y=alt.Y("value:Q", title=y_title),
            color=alt.Color("map:N", title=None, sort=names, scale=alt.Scale(scheme="tableau20"),
                            legend=alt.Legend(orient="bottom", columns=1 if narrow else 3, labelLimit=300)),
            opacity=alt.condition(pick, alt.value(0.95), alt.value(0.12)),
            tooltip=[alt.Tooltip("map:N", title=t("faith_page.map")),
                     alt.Tooltip("percent:Q", format=".0f", title=t("faith_page.percent_axis")),
                     alt.Tooltip("value:Q", format=".4f", title=y_title)],
        )
        if not panels:
            maps = maps.add_params(pick)
        first = [table_layer(shown)] if not panels else []  # "Show data": every curve, random orders too
        panels.append(alt.layer(*first, band, mean, maps, title=which[key]).properties(width=width, height=260))
    return alt.vconcat(*panels) if narrow else alt.hconcat(*panels)


def results(result: fa.Faithfulness, narrow: bool = False) -> None:
    fill = t(f"faithfulness.fill_{result.fill}")
    st.info(fa.sentence(result, lang()))
    chart = curves_chart(result, narrow)
    caption = t("faith_page.chart_caption", fill=fill, orders=len(result.random))
    st.altair_chart(described(chart), alt=caption)
    st.caption(caption)
    download_chart(chart, f"deletion_insertion_curves_{result.fill}", key="faith_curves")
    verdict = lambda v: t(f"faith_page.verdict_{v}")  # noqa: E731
    rows = fa.table(result, lang())
    table = pd.DataFrame({
        t("faith_page.rank"): [r["rank"] or "—" for r in rows],
        t("faith_page.map"): [r["map"] for r in rows],
        t("faith_page.deletion_area", fill=fill): [
            f"{r['deletion_area']:.3f}" + (f" ± {r['deletion_spread']:.3f}" if "deletion_spread" in r else "")
            for r in rows],
        t("faith_page.against_random"): [verdict(r["deletion_verdict"]) if r["rank"] else "" for r in rows],
        t("faith_page.insertion_area", fill=fill): [
            f"{r['insertion_area']:.3f}" + (f" ± {r['insertion_spread']:.3f}" if "insertion_spread" in r else "")
            for r in rows],
        t("faith_page.against_random_ins"): [verdict(r["insertion_verdict"]) if r["rank"] else "" for r in rows],
    })
    if narrow:  # a phone: the two areas beside the names, under short headings, in a table whose names wrap (a data
        # frame's map column alone was 270 px wide: the areas were cut off at the right); the verdicts are in the
        # sentence and on a wider screen, the fill in the caption
        short = [t("faith_page.map"), t("faith_page.deletion_short") + " ↓", t("faith_page.insertion_short") + " ↑"]
        st.markdown(markdown_table(short, [[escape_markdown(str(cell)) for cell in row]
                                           for row in table.iloc[:, [1, 2, 4]].values.tolist()]))
    else:
        st.dataframe(table, hide_index=True, width="stretch")
    st.caption(t("faith_page.table_caption", fill=fill, inputs=result.inputs))
    for note in result.notes:
        st.caption(note)


LINKED = (  # a fill the model does not offer (token removal on a RoPE model) gives way to its first
    Linked("fill", "faith_fill", one_of(fa.FILLS), lambda ctx: fills_for(ctx.model)[0][0],
           fits=lambda fill, ctx: fill in fills_for(ctx.model)[0]),
    Linked("each_head", "faith_heads", flag, lambda ctx: False, write_flag),
)


def show(ctx: Context) -> None:
    st.markdown(t("faith_page.explain"))
    fills, why_not = fills_for(ctx.model)
    for spec in LINKED:
        spec.prepare(st.session_state, ctx)
    left, right = st.columns([3, 2])
    fill = left.radio(t("faith_page.fill"), fills, key="faith_fill", horizontal=True,
                      format_func=lambda f: t(f"faithfulness.fill_{f}"), help=t("faith_page.fill_help"))
    with_heads = fa.map_count(ctx.model, ctx.cap, heads=True)
    heads = right.checkbox(t("faith_page.heads"), key="faith_heads", help=t(
        "faith_page.heads_help", heads=ctx.cap.num_heads, maps=with_heads, without=fa.map_count(ctx.model, ctx.cap),
        passes=fa.planned_inputs(with_heads)))
    if why_not:
        st.caption(why_not)
    result = measure_or_wait(ctx.model, ctx.cap, ctx.cap_key, fill or fills[0], heads, "faith")
    if result is not None:
        results(result, ctx.narrow)


register(View("faithfulness", show, order=92, linked=LINKED, no_layer_head="classroom.no_layer_head_faithfulness"))
