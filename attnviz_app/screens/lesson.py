"""Classroom mode: how attention works, step by step, with live numbers from the current photo and model.

Every number is computed by :mod:`attnviz.lesson`; this page only lays out widgets, formulas and pictures.
"""
from __future__ import annotations

import math

import streamlit as st

from attnviz_app import startup

with startup.importing():
    import altair as alt
    import numpy as np
    import pandas as pd
    from PIL import Image

    from attnviz_app import classroom, heavy, links, sources, ui
    from attnviz import Capture, Model, i18n, lesson, render
    from attnviz_app.text import listed, t
    from attnviz_app.views.base import patch_named
    from attnviz_app.views.common import SVG, described, markdown_table

CMAP = "inferno"
QUERY_COLOUR, KEY_COLOUR = (0, 229, 255), (255, 64, 160)  # cyan query, magenta key: both visible on inferno
DISPLAY_PX = 392
LESSON_PATH = "lesson"  # this page's address (Streamlit names it after the file): the join box's QR code opens it


# --- Small drawing helpers (pictures only; every number comes from attnviz.lesson) -------------

def matrix_picture(matrix: np.ndarray, cell: int) -> Image.Image:
    """A matrix as coloured cells, ``cell`` pixels each (dark = small, bright = large)."""
    rgb = render.colorize(render.normalise(np.asarray(matrix, dtype=np.float32)), "viridis")
    picture = Image.fromarray(rgb)
    return picture.resize((picture.width * cell, picture.height * cell), Image.Resampling.NEAREST)


def formula(*lines: str, joiner: str = " ", aligned: bool = True, stacked: bool | None = None) -> str:
    """A displayed formula of several parts: on one line on a wide screen (``joiner`` between the parts), one part a
    line on a phone, whose 358 px column cut the long ones off at the right (they scrolled sideways, which nothing on
    the page said); there the parts are aligned at their ``&``, or centred (``aligned=False``). A newline in a part
    breaks it there on a phone too. ``stacked``: one part a line (True) or not (False) on any screen (the projector's
    narrow columns)."""
    if not (classroom.narrow() if stacked is None else stacked):
        return joiner.join(line.replace("&", "").replace("\n", "") for line in lines)
    if aligned:
        return r"\begin{aligned}" + r" \\ ".join(line.replace("\n", r" \\ &") for line in lines) + r"\end{aligned}"
    return r"\begin{gathered}" + r" \\ ".join(line.replace("&", "").replace("\n", r" \\ ") for line in lines) \
        + r"\end{gathered}"


def remembered_choice(widget, label: str, options: list, key: str, format_func, **kwargs):
    """A radio / selectbox whose translated labels survive a language switch.

    The widget's key carries the language, so a switch makes a fresh widget with the new labels (a kept
    widget would keep the old ones and can come back empty); the choice itself is remembered under a
    language-free key and becomes the new widget's starting value.
    """
    memory = links.memory_of(key)
    previous = st.session_state.get(memory)
    index = options.index(previous) if previous in options else 0
    lang = st.session_state.get("lang", "en")
    if widget.__name__ == "selectbox":  # Streamlit's own "Choose an option", in the reader's language
        kwargs.setdefault("placeholder", t("classroom.choose"))
    value = widget(label, options, index=index, key=f"{key}.{lang}", format_func=format_func, **kwargs)
    st.session_state[memory] = value
    return value


STEP_MEMORY = links.memory_of(links.LESSON_STEP)  # the step shown, as a number: it outlives the tabs' translated labels
D_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # the scaling step's d_k choices
FIRST_D_K, FIRST_DIVISOR = 64, 1.0
PAIR_BOX = "pair_kind"
PAIR_KIND = links.memory_of(PAIR_BOX)  # the pair step's query kind
# the last step's choices: Rank patches by (remembered_choice's memory), Remove a patch by (likewise), Remove up to
RANK_BOX, REMOVE_BOX, UP_TO = "perturb_head", "perturb_fill", "perturb_max"
RANK, REMOVE = links.memory_of(RANK_BOX), links.memory_of(REMOVE_BOX)
UP_TOS, FIRST_UP_TO = range(10, 91, 10), 50


def first_pair(cap: Capture) -> dict[str, int]:
    """The pair step's sliders (rows and columns counted from 1) where a reader first finds them: the query patch
    in the middle of the grid, the key patch one down and one right of it."""
    h, w = cap.grid
    return {"pair_q_row": h // 2, "pair_q_col": w // 2, "pair_k_row": h // 2 + 1, "pair_k_col": w // 2 + 1}


def follow_link(cap: Capture) -> None:
    """Before the steps are drawn: the lesson's own choices a link names, once (the pair step's ``query=cls`` or
    ``query=r3c4`` and ``key=r5c6``, the scaling step's ``dk=16&divisor=4``, the last step's ``rank=3&remove=blur&upto=90``
    where head 3 ranks the patches), where this grid and model have them; and every pair slider on this grid (a value
    kept from a larger input size is back at its first)."""
    state = st.session_state
    h, w = cap.grid
    query, key = links.asked("query") or "", links.asked("key") or ""
    if query == "cls":
        state[PAIR_KIND] = "cls"
    elif (patch := patch_named(query)) and patch[0] < h and patch[1] < w:
        state[PAIR_KIND], state["pair_q_row"], state["pair_q_col"] = "patch", patch[0] + 1, patch[1] + 1
    if (patch := patch_named(key)) and patch[0] < h and patch[1] < w:
        state["pair_k_row"], state["pair_k_col"] = patch[0] + 1, patch[1] + 1
    if (d_k := links.asked("dk") or "").isdecimal() and int(d_k) in D_KS:
        state["scale_dk"] = int(d_k)
    try:
        divisor = float(links.asked("divisor") or "nan")
    except ValueError:
        divisor = math.nan
    if 1.0 <= divisor <= 20.0:
        state["scale_divisor"] = round(divisor * 2) / 2  # on the slider's steps of 0.5
    rank = links.asked("rank") or ""
    if rank == "mean" or (rank.isdecimal() and 1 <= int(rank) <= cap.num_heads):
        state[RANK] = rank if rank == "mean" else int(rank) - 1
    if (remove := links.asked("remove")) in lesson.FILLS:
        state[REMOVE] = remove
    if (up_to := links.asked("upto") or "").isdecimal() and int(up_to) in UP_TOS:
        state[UP_TO] = int(up_to)
    if state.get(RANK, "mean") not in ("mean", *range(cap.num_heads)):  # kept from a model with more heads
        state.pop(RANK)
    for name, first in first_pair(cap).items():
        if state.get(name) not in range(1, (h if "row" in name else w) + 1):
            state[name] = first
    state.setdefault("scale_dk", FIRST_D_K)
    state.setdefault("scale_divisor", FIRST_DIVISOR)
    state.setdefault(UP_TO, FIRST_UP_TO)


def link_words(cap: Capture) -> dict[str, str]:
    """What a link to the lesson says of its own choices, where they are not the first."""
    state = st.session_state
    words = {}
    if state.get(PAIR_KIND) == "patch":
        words["query"] = f"r{state['pair_q_row']}c{state['pair_q_col']}"
    first = first_pair(cap)
    if (state["pair_k_row"], state["pair_k_col"]) != (first["pair_k_row"], first["pair_k_col"]):
        words["key"] = f"r{state['pair_k_row']}c{state['pair_k_col']}"
    if state["scale_dk"] != FIRST_D_K:
        words["dk"] = str(state["scale_dk"])
    if state["scale_divisor"] != FIRST_DIVISOR:
        words["divisor"] = f"{state['scale_divisor']:g}"
    if state.get(RANK, "mean") != "mean":
        words["rank"] = str(state[RANK] + 1)
    if state.get(REMOVE, lesson.FILLS[0]) != lesson.FILLS[0]:
        words["remove"] = state[REMOVE]
    if state[UP_TO] != FIRST_UP_TO:
        words["upto"] = str(state[UP_TO])
    return words


def shown_step(labels: list[str]) -> tuple[str, int]:
    """The tabs' key (it carries the language, as :func:`remembered_choice`'s) and the step shown: the tabs' own
    choice, else the remembered one (a language switch, a link's ``step``), else the first."""
    key = f"{links.LESSON_STEP}.{st.session_state.get('lang', 'en')}"
    if st.session_state.get(key) in labels:
        return key, labels.index(st.session_state[key])
    kept = st.session_state.get(STEP_MEMORY, 0)
    return key, kept if isinstance(kept, int) and 0 <= kept < len(labels) else 0


def step_tabs(labels: list[str]):
    """The lesson's tabs, at the step shown (:func:`shown_step`): (the tabs, the step shown)."""
    key, step = shown_step(labels)
    if key not in st.session_state:  # a link's step, or the one kept through a language switch: set, not a default,
        st.session_state[key] = labels[step]  # as a default that changes makes a new widget, which opens on step 1
    tabs = st.tabs(labels, key=key, on_change="rerun")  # a new step reruns: the address follows
    st.session_state[STEP_MEMORY] = step
    return tabs, step


def next_step(labels: list[str], by: int) -> None:
    """Button callback (and the presenter's ←/→ shortcuts): the previous or next step, none past either end."""
    key, step = shown_step(labels)
    step = min(max(step + by, 0), len(labels) - 1)
    st.session_state[key], st.session_state[STEP_MEMORY] = labels[step], step


SQUARE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
LABEL_PX = 13  # the squares' labels: 12 px and more once a phone's column scales the chart down
# a label's line, in the chart's own pixels: its text box, from its font's ascent to its descent, is 17 px on the page,
# where Vega draws the chart's 360 px at 94 % (its padding inside the chart's size)
LINE_PX = 19


def square_labels(sizes: list[tuple[str, int]], side: int) -> list[dict]:
    """Where each nested square's label goes (pixels from the top left of a ``side`` px chart): inside its square's
    top-left corner where it fits there above the next smaller square, else right of the squares too small to hold
    theirs, one under the other, ``LINE_PX`` apart. Drawn inside, the 196 and 224 px squares' labels (15 px apart)
    overlapped; outside, 15 px apart, their text boxes still did (by a pixel: a "p"'s tail over the next line's digits)."""
    largest = max(n for _, n in sizes)
    colour = {label: SQUARE_COLOURS[i % len(SQUARE_COLOURS)] for i, (label, _) in enumerate(sizes)}
    ranked = sorted(sizes, key=lambda s: -s[1])
    edges = [max(2, round((side - 1) * n / largest)) for _, n in ranked]
    wide = lambda text: 0.58 * LABEL_PX * len(text)  # noqa: E731  (ASCII in Vega's sans-serif: ~0.55 em a character)
    texts = [f"{label}: N = {n}" for label, n in ranked]
    # inside: as wide as its square, and between its square's top and the next smaller square's
    inside = [wide(text) + 8 <= edge and (i + 1 == len(edges) or edge - edges[i + 1] >= LINE_PX + 3)
              for i, (text, edge) in enumerate(zip(texts, edges))]
    first_outside = next((i for i, fits in enumerate(inside) if not fits), len(edges))
    outside_x = edges[first_outside] + 6 if first_outside < len(edges) else 0
    placed, below = [], 0.0
    for i, (text, edge, (label, n)) in enumerate(zip(texts, edges, ranked)):
        top = side - edge
        if i < first_outside:
            x, y = 4.0, top + 3.0
        else:
            x, y = outside_x, max(top + 3.0, below)
            below = y + LINE_PX
        placed.append({"label": text, "size": label, "x": x, "y": y, "edge": edge, "top": top,
                       "colour": colour[label], "outside": i >= first_outside})
    return placed


def pair_squares(sizes: list[tuple[str, int]], side: int = 360) -> alt.Chart:
    """Nested N × N squares drawn to scale: each one's area is one head's number of query–key pairs. An SVG chart of
    ``side`` px: a narrow column scales it down whole, its labels with it."""
    placed = pd.DataFrame(square_labels(sizes, side))
    placed["zero"], placed["right"], placed["bottom"] = 0, placed["edge"], side
    placed["tx"], placed["ty"] = placed["x"] - 3, placed["y"] + LABEL_PX / 2  # a leader's end, left of a label outside
    x_scale = alt.Scale(domain=[0, side], nice=False, zero=False)
    y_scale = alt.Scale(domain=[0, side], nice=False, zero=False, reverse=True)  # pixels down from the top
    x, y = alt.X("zero:Q", scale=x_scale, axis=None), alt.Y("top:Q", scale=y_scale, axis=None)
    colour = alt.Color("size:N", scale=alt.Scale(domain=list(placed["size"]), range=list(placed["colour"])), legend=None)
    squares = alt.Chart(placed).mark_rect(fillOpacity=0.25, strokeWidth=2).encode(
        x=x, x2="right:Q", y=y, y2="bottom:Q", color=colour, stroke=colour,
        tooltip=[alt.Tooltip("label:N", title=t("lesson.cost.size"))])
    leaders = alt.Chart(placed[placed["outside"]]).mark_rule(strokeWidth=1).encode(
        x=alt.X("edge:Q", scale=x_scale, axis=None), x2="tx:Q", y=alt.Y("top:Q", scale=y_scale, axis=None),
        y2="ty:Q", color=colour)
    labels = alt.Chart(placed).mark_text(align="left", baseline="top", fontSize=LABEL_PX, fontWeight="bold").encode(
        x=alt.X("x:Q", scale=x_scale, axis=None), y=alt.Y("y:Q", scale=y_scale, axis=None), text="label:N", color=colour)
    return alt.layer(squares, leaders, labels).properties(width=side, height=side, usermeta=SVG).configure_view(
        strokeWidth=0)


def plain(x: float) -> str:
    """A probability written out without exponents, with enough decimals to show it is not 0 or 1."""
    if 0.01 <= x <= 0.99 or x in (0.0, 1.0):
        return f"{x:.2f}"
    if x > 0.99:
        return f"{x:.{max(2, math.ceil(-math.log10(1 - x)))}f}"
    return f"{x:.{math.ceil(-math.log10(x)) + 1}f}"


def num(x: float, digits: int = 2) -> str:
    """Fixed decimals, or three significant digits once a number is too long to read (e^50 …)."""
    return f"{x:.3g}" if abs(x) >= 1e5 else f"{x:.{digits}f}"


def vector(v: np.ndarray, digits: int = 2) -> str:
    return "[" + ", ".join(num(x, digits) for x in v) + "]"


def short(v: np.ndarray) -> str:
    """A hand-typed vector as typed: [1, 0], [0.5, -2]."""
    return "[" + ", ".join(f"{x:g}" for x in v) + "]"


def bars(values: np.ndarray, labels: list[str], title: str, domain=(0, 1)) -> alt.Chart:
    table = pd.DataFrame({"token": labels, "weight": values, "text": [plain(v) for v in values]})
    base = alt.Chart(table).encode(
        x=alt.X("token:N", sort=None, title=None, axis=alt.Axis(labelAngle=0)),
        y=alt.Y("weight:Q", scale=alt.Scale(domain=list(domain)), title=title),
    )
    return (base.mark_bar() + base.mark_text(dy=-8).encode(text="text:N")).properties(height=220)


# --- The steps ---------------------------------------------------------------------------------

def step_qkv(model: Model, cap: Capture, layer: int, head: int, present: bool = False) -> None:
    s = lesson.shapes(model)
    h, w = s.grid
    formula_of_q = formula(
        rf"\underbrace{{Q}}_{{{s.tokens}\times{s.head_dim}}} &= \underbrace{{X}}_{{{s.tokens}\times{s.embed_dim}}}"
        rf"\,\underbrace{{W_Q}}_{{{s.embed_dim}\times{s.head_dim}}}", r"K &= X W_K", r"V &= X W_V", joiner=r",\quad ")
    if present:  # the projector: the formula and the words beside the pictures, all on the first screen
        text, pictures = st.columns([1, 1.25], gap="large")
        text.latex(formula_of_q)
        text.markdown(t("lesson.qkv.intro"))
    else:
        st.markdown(t("lesson.qkv.intro"))
        st.latex(formula_of_q)
    st.markdown(t(
        "lesson.qkv.numbers", n=s.tokens, prefix=s.prefix_tokens, h=h, w=w, d=s.embed_dim, heads=s.heads,
        dk=s.head_dim, layers=s.layers, rows=s.qkv_weight[0], cols=s.qkv_weight[1], patch=s.patch,
    ))
    if not present:
        pictures = st.container()
    window = cap.window(layer, 0)  # every token, in a plain ViT
    q = window.query[head].cpu().numpy()  # (N, d_k)
    k = window.key[head].cpu().numpy()  # (N, d_k)
    weights = cap.weights(layer, head)  # (N, N)
    cell = max(1, 200 // s.tokens)
    left, mid, right = pictures.columns([1, 2, 2])
    # Q is tall (N × d_k): at a phone's full width it was 1100 px of scrolling; two pixels a number across
    left.image(matrix_picture(q, cell), caption=t("lesson.qkv.q_picture", n=s.tokens, dk=s.head_dim),
               width=min(2 * s.head_dim * cell, 160))
    mid.image(matrix_picture(k.T, cell), caption=t("lesson.qkv.k_picture", n=s.tokens, dk=s.head_dim))
    right.image(matrix_picture(weights, cell), caption=t("lesson.qkv.a_picture", n=s.tokens))
    m = min(4 if classroom.narrow() else 6, s.head_dim)  # six numbers ran 45 px past a phone's column, out of sight
    st.markdown(t("lesson.qkv.table", layer=layer + 1, head=head + 1, m=m))
    shown = min(4, s.tokens)
    names = [t("lesson.cls_token") if i < s.prefix_tokens else t("lesson.patch_token", n=i) for i in range(shown)]
    dims = [f"{i + 1}" for i in range(m)]
    cols = st.columns(2)
    cols[0].dataframe(pd.DataFrame(q[:shown, :m], index=names, columns=dims).style.format("{:.3f}"))
    cols[0].caption(t("lesson.qkv.q_rows", m=m, dk=s.head_dim))
    cols[1].dataframe(pd.DataFrame(k[:shown, :m], index=names, columns=dims).style.format("{:.3f}"))
    cols[1].caption(t("lesson.qkv.k_rows", m=m, dk=s.head_dim))


def step_by_hand(present: bool = False) -> None:
    if present:  # the projector: the numbers to change, the weights' chart and the result side by side
        given, chart_col, result_col = st.columns([1.3, 0.9, 1.3], gap="medium")
    else:
        st.markdown(t("lesson.hand.intro"))
        given = st.container()
    default_keys = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))
    cols = given.columns(4)
    cols[0].markdown(f"**{t('lesson.hand.query')}**")
    q = [cols[0].number_input(f"q₁ [{d + 1}]", -10.0, 10.0, (1.0, 0.0)[d], 0.5, key=f"ex_q{d}") for d in range(2)]
    keys = []
    for j in range(3):
        cols[j + 1].markdown(f"**{t('lesson.hand.key', j='₁₂₃'[j])}**")
        keys.append([
            cols[j + 1].number_input(f"k{'₁₂₃'[j]} [{d + 1}]", -10.0, 10.0, default_keys[j][d], 0.5, key=f"ex_k{j}{d}")
            for d in range(2)
        ])
    same = given.toggle(t("lesson.hand.values_are_keys"), value=True, key="ex_same")
    values = None
    if not same:
        vcols = given.columns(4)
        vcols[0].markdown(f"**{t('lesson.hand.values')}**")
        values = [
            [vcols[j + 1].number_input(f"v{'₁₂₃'[j]} [{d + 1}]", -10.0, 10.0, default_keys[j][d], 0.5,
                                       key=f"ex_v{j}{d}") for d in range(2)]
            for j in range(3)
        ]
    ex = lesson.worked_example(q, keys, values)

    sub = "₁₂₃"
    header = [t("lesson.hand.token"), "k", "v", "q·k", "q·k / √2", "e^(q·k / √2)", t("lesson.hand.weight")]
    rows = [[f"{j + 1}", short(ex.keys[j]), short(ex.values[j]), f"{ex.scores[j]:.2f}", f"{ex.scaled[j]:.3f}",
             num(ex.exps[j]), f"{ex.weights[j]:.2f}"] for j in range(3)]
    rows.append(["Σ", "", "", "", "", num(ex.exp_sum), f"{ex.weights.sum():.2f}"])
    weights_formula = rf"w_j = \frac{{e^{{q\cdot k_j/\sqrt{{2}}}}}}{{\Sigma}} = {vector(ex.weights)}"
    terms = " + ".join(f"{ex.weights[j]:.2f}\\,{short(ex.values[j])}" for j in range(3))
    output_formula = formula(r"o &= \sum_j w_j\, v_j", rf"&= {terms}", rf"&= {vector(ex.output)}", stacked=present or None)
    if present:
        chart_col.altair_chart(described(bars(ex.weights, [f"k{sub[j]}" for j in range(3)], t("lesson.hand.weight"))),
                               width="stretch")
        chart_col.caption(t("lesson.hand.chart_caption"))
        result_col.latex(weights_formula)
        result_col.latex(output_formula)
        st.markdown(t("lesson.hand.intro"))
        st.markdown(markdown_table(header, rows))
    else:
        left, right = st.columns([3, 2], gap="large")
        left.markdown(markdown_table(header, rows, transposed=classroom.narrow()))
        right.altair_chart(described(bars(ex.weights, [f"k{sub[j]}" for j in range(3)], t("lesson.hand.weight"))),
                           width="stretch")
        right.caption(t("lesson.hand.chart_caption"))

    dots = " ".join(
        rf"q\cdot k_{j + 1} &= " + " + ".join(f"({a:g})({b:g})" for a, b in zip(ex.query, ex.keys[j]))
        + rf" = {ex.scores[j]:.2f} \\" for j in range(3)
    )
    st.latex(r"\begin{aligned}" + dots + r"\end{aligned}")
    st.latex(rf"\frac{{q\cdot k_j}}{{\sqrt{{d_k}}}} = \frac{{q\cdot k_j}}{{\sqrt{{2}}}} = {vector(ex.scaled, 3)}")
    st.latex(rf"e^{{q\cdot k_j/\sqrt{{2}}}} = {vector(ex.exps)},\qquad \Sigma = {num(ex.exp_sum)}")
    if not present:
        st.latex(weights_formula)
        st.latex(output_formula)
    st.success(t("lesson.hand.output", output=vector(ex.output)))


def step_scale(present: bool = False) -> None:
    # the projector: the words and softmax's formula beside its two charts
    text, charts = st.columns([1, 2], gap="large") if present else (st.container(), st.container())
    text.markdown(t("lesson.scale.intro"))
    text.latex(r"\text{softmax}(s)_j = \frac{e^{s_j}}{\sum_m e^{s_m}}")
    labels = ["s₁", "s₂", "s₃"]
    left, right = charts.columns(2)
    for col, scores in ((left, (2.0, 1.0, 0.0)), (right, (20.0, 10.0, 0.0))):
        weights = lesson.softmax(scores)
        col.altair_chart(described(bars(weights, labels, t("lesson.hand.weight"))), width="stretch")
        col.markdown(t("lesson.scale.result", scores=vector(np.array(scores), 0),
                       weights="[" + ", ".join(plain(v) for v in weights) + "]"))
    st.markdown(t("lesson.scale.slider_intro"))
    divisor = st.slider(t("lesson.scale.divisor"), 1.0, 20.0, step=0.5, key="scale_divisor")  # first: follow_link
    scores = np.array([20.0, 10.0, 0.0])
    weights = lesson.softmax(scores, 1 / divisor)
    left, right = st.columns([2, 3])
    left.altair_chart(described(bars(weights, labels, t("lesson.hand.weight"))), width="stretch")
    right.latex(formula(rf"&\text{{softmax}}\left(\frac{{[20, 10, 0]}}{{{divisor:g}}}\right)",
                        "&= [" + ", ".join(plain(v) for v in weights) + "]"))
    right.markdown(t("lesson.scale.slider_note"))

    st.subheader(t("lesson.scale.experiment"))
    st.markdown(t("lesson.scale.experiment_intro"))
    d_k = st.select_slider("d_k", D_KS, key="scale_dk")
    sample = lesson.dot_products(d_k, samples=4000, seed=0)
    # One x axis for both histograms, so the narrowing is seen, not only read.
    reach = float(np.abs(sample.dots).max())
    edges = np.linspace(-reach, reach, 101)
    left, right = st.columns(2)
    for col, data, title, var, expected in (
        (left, sample.dots, "q·k", sample.dots_var, d_k),
        (right, sample.scaled, "q·k / √d_k", sample.scaled_var, 1),
    ):
        counts, _ = np.histogram(data, bins=edges)
        table = pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "count": counts})
        chart = alt.Chart(table).mark_rect().encode(
            x=alt.X("lo:Q", title=title, scale=alt.Scale(domain=[-reach, reach])), x2="hi:Q",
            y=alt.Y("count:Q", title=t("lesson.scale.count")), y2=alt.datum(0),
        ).properties(height=220)
        col.altair_chart(described(chart), width="stretch")
        col.markdown(t("lesson.scale.variance", what=title, var=var, expected=expected, std=math.sqrt(var)))
    st.info(t("lesson.scale.conclusion", dk=d_k, root=math.sqrt(d_k)))


def step_pair(model: Model, cap: Capture, view: Image.Image, layer: int, head: int, present: bool = False) -> None:
    h, w = cap.grid
    if not present:
        st.markdown(t("lesson.pair.intro"))
    # the projector: every control in one row, so that the pictures and the formulas fit under it
    controls = st.columns([1.3, 1, 1, 1, 1, 1.3]) if present else st.columns(3)
    query_place, key_place, tokens_place = (controls[1:3], controls[3:5], controls[5]) if present else (
        controls[:1] * 2, controls[1:2] * 2, controls[2])
    kind = remembered_choice(
        controls[0].radio, t("lesson.pair.query"), ["cls", "patch"], horizontal=not present, key=PAIR_BOX,
        format_func=lambda k: t("lesson.cls_token") if k == "cls" else t("lesson.pair.a_patch"),
    )
    q_row = q_col = None
    if kind == "patch":
        q_row = query_place[0].slider(t("lesson.pair.q_row"), 1, h, key="pair_q_row") - 1  # first: follow_link
        q_col = query_place[1].slider(t("lesson.pair.q_col"), 1, w, key="pair_q_col") - 1
    k_row = key_place[0].slider(t("lesson.pair.k_row"), 1, h, key="pair_k_row") - 1
    k_col = key_place[1].slider(t("lesson.pair.k_col"), 1, w, key="pair_k_col") - 1
    query = 0 if kind == "cls" else lesson.token_index(cap, q_row, q_col)
    key = lesson.token_index(cap, k_row, k_col)
    tokens_place.markdown(t("lesson.pair.tokens", q=query, k=key, layer=layer + 1, head=head + 1))

    pair = lesson.pair_score(cap, layer, head, query, key)
    row_map = cap.query_map(layer, head, query)  # (h, w): the heatmap of this query's row
    cell = float(cap.weights(layer, head)[query, key])

    if present:
        pictures, maths = st.columns([1.2, 1], gap="large")
        left, right = pictures.columns(2)
    else:
        left, right = st.columns(2, gap="large")
        maths = st.container()
    marks = [(k_row, k_col, KEY_COLOUR)] + ([] if q_row is None else [(q_row, q_col, QUERY_COLOUR)])
    left.image(render.outline(render.enlarge(view, DISPLAY_PX), cap.grid, marks), caption=t("lesson.pair.photo_caption"), width=DISPLAY_PX)
    heat = render.enlarge(render.overlay(view, row_map, alpha=0.75, cmap=CMAP), DISPLAY_PX)
    right.image(render.outline(heat, cap.grid, marks), caption=t("lesson.pair.heat_caption", row=k_row + 1, col=k_col + 1),
                width=DISPLAY_PX)

    maths.latex(rf"q_i\cdot k_j = \sum_{{c=1}}^{{{cap.layout(layer).head_dim}}} q_{{i,c}}\,k_{{j,c}} = {pair.dot:.4f}")
    maths.latex(rf"s_{{ij}} = \frac{{q_i\cdot k_j}}{{\sqrt{{d_k}}}} = {pair.dot:.4f} \times {pair.scale:g} = {pair.scaled:.4f}")
    maths.latex(formula(
        rf"a_{{ij}} &= \frac{{e^{{s_{{ij}}}}}}{{\sum_{{m=1}}^{{{cap.num_tokens}}} e^{{s_{{im}}}}}}",
        rf"&= \frac{{{pair.exp:.5g}}}{{{pair.exp_sum:.5g}}} = {pair.weight:.6g}", stacked=present))
    maths.success(t("lesson.pair.equal", weight=f"{pair.weight:.6g}", cell=f"{cell:.6g}",
                    diff=f"{abs(pair.weight - cell):.1e}", row=k_row + 1, col=k_col + 1))
    if present:
        st.markdown(t("lesson.pair.intro"))


def step_heads(cap: Capture, view: Image.Image, layer: int, present: bool = False) -> None:
    s_heads, d_k = cap.num_heads, cap.layouts[0].head_dim
    # the projector: the words and the formula beside the heads' pictures
    text, grid = st.columns([1, 2.2], gap="large") if present else (st.container(), st.container())
    text.markdown(t("lesson.heads.intro", heads=s_heads, layer=layer + 1))
    per_row = min(s_heads, 6)
    for start in range(0, s_heads, per_row):
        cols = grid.columns(per_row)
        for offset, col in enumerate(cols):
            head = start + offset
            if head >= s_heads:
                break
            cls_map = cap.summary_map(layer, head)
            col.image(render.enlarge(render.overlay(view, cls_map, alpha=0.7, cmap=CMAP), 224),
                      caption=t("lesson.heads.caption", n=head + 1, top=float(cls_map.max())))
    (text if present else st).latex(formula(  # under the pictures elsewhere
        r"\text{head}_i &= \text{softmax}\!\left(\frac{Q_i K_i^\top}{\sqrt{d_k}}\right) V_i",
        r"\text{MultiHead}(X) &=" "\n" r"\text{Concat}(\text{head}_1,\dots,\text{head}_{" + str(s_heads) + r"})\, W_O",
        joiner=r",\qquad ", aligned=False, stacked=present or None))
    st.markdown(t("lesson.heads.concat", heads=s_heads, dk=d_k, d=s_heads * d_k, n=cap.num_tokens))


def step_cost(model: Model, present: bool = False) -> None:
    p = model.patch
    sizes = lesson.LESSON_SIZES if all(s % p == 0 for s in lesson.LESSON_SIZES) else (112, 224, 448, 896)
    rows = lesson.cost_table(sizes, p, model.num_prefix_tokens, model.depth, model.num_heads, model.head_dim)
    first = rows[0]
    now, = lesson.cost_table((model.size,), p, model.num_prefix_tokens, model.depth, model.num_heads, model.head_dim)
    memory_formula = formula(  # the page's own size, in the caption's words: layers × heads × N² × 4 bytes
        rf"N &= \left(\tfrac{{{now.size}}}{{{p}}}\right)^2 + {model.num_prefix_tokens} = {now.tokens}",
        rf"L\,H\,N^2 \cdot 4\,\mathrm{{B}} &= {model.depth} \cdot {model.num_heads} \cdot {now.tokens}^2 \cdot 4\,"
        rf"\mathrm{{B}}" "\n" rf"= {now.map_bytes / 1e6:,.1f}\,\mathrm{{MB}}", joiner=r",\qquad ", stacked=present or None)
    table = pd.DataFrame({
        t("lesson.cost.size"): [f"{r.size} px" for r in rows],
        t("lesson.cost.grid"): [f"{r.grid} × {r.grid}" for r in rows],
        "N": [r.tokens for r in rows],
        t("lesson.cost.pairs"): [f"{r.pairs:,}" for r in rows],
        t("lesson.cost.times"): [f"× {r.pairs / first.pairs:.1f}" for r in rows],
        t("lesson.cost.maps"): [f"{r.map_bytes / 1e6:,.1f} MB" for r in rows],
        t("lesson.cost.qk"): [f"{r.qk_bytes / 1e6:,.1f} MB" for r in rows],
    })
    squares = pd.DataFrame({
        "size": [f"{r.size} px" for r in rows], "N": [r.tokens for r in rows], "zero": 0,
        "mb": [r.map_bytes / 1e6 for r in rows],
    })
    memory = alt.Chart(squares).mark_bar().encode(
        x=alt.X("size:N", sort=None, title=t("lesson.cost.size"), axis=alt.Axis(labelAngle=0)),
        y=alt.Y("mb:Q", title=t("lesson.cost.maps")),
        tooltip=[alt.Tooltip("size:N", title=t("lesson.cost.size")), alt.Tooltip("N:Q", title="N"),
                 alt.Tooltip("mb:Q", format=",.1f", title=t("lesson.cost.maps"))],
    ).properties(height=300 if present else 320)
    if present:  # the projector: the words and the formula beside the squares and the chart; the table under them
        text, left, right = st.columns([1, 1, 1.1], gap="medium")
        text.markdown(t("lesson.cost.intro"))
        text.latex(memory_formula)
    else:
        st.markdown(t("lesson.cost.intro"))
        st.latex(memory_formula)
    table_place = st.container()
    if classroom.narrow():  # seven columns ran 330 px past a phone's column: a row per quantity, a column per size
        table_place.markdown(markdown_table(list(table.columns), table.astype(str).values.tolist(), transposed=True))
    else:
        table_place.dataframe(table, hide_index=True, width="stretch")
    table_place.caption(t("lesson.cost.caption", layers=model.depth, heads=model.num_heads, patch=p, size=model.size))
    if not present:
        left, right = st.columns(2)
    left.altair_chart(described(pair_squares([(f"{r.size} px", r.tokens) for r in rows])), width="content",
                      key="cost_squares")
    left.caption(t("lesson.cost.squares_caption"))
    right.altair_chart(described(memory), width="stretch")
    by_size = {r.size: r for r in rows}
    a, b = next(((r, by_size[2 * r.size]) for r in rows if 2 * r.size in by_size), (rows[0], rows[-1]))
    st.info(t("lesson.cost.doubling", s1=a.size, s2=b.size, n1=a.tokens, n2=b.tokens, ratio=b.pairs / a.pairs))


def step_not_explanation(model: Model, cap: Capture, key: tuple, layer: int, present: bool = False) -> None:
    # the projector: the test's controls and formula beside the photo with the patches it removes; the words under them
    test, preview = st.columns([1.4, 1], gap="large") if present else (st.container(), None)
    words = st.container() if present else test
    words.markdown(t("lesson.explain.summary"))
    words.subheader(t("lesson.explain.test_title"))
    words.markdown(t("lesson.explain.test_intro"))
    test.latex(r"\Delta(k) = p(y \mid x) - p(y \mid x_{\setminus k})" if model.labels is not None else
               r"\Delta(k) = 1 - \cos\big(z(x),\, z(x_{\setminus k})\big)")  # k patches removed: what the chart shows
    controls = test.columns(3)
    head = remembered_choice(
        controls[0].selectbox, t("lesson.explain.rank_by"), ["mean", *range(cap.num_heads)], key=RANK_BOX,
        format_func=lambda h: t("lesson.explain.mean_heads") if h == "mean" else t("lesson.head_n", n=h + 1),
    )
    fill = remembered_choice(controls[1].radio, t("lesson.explain.fill"), list(lesson.FILLS), key=REMOVE_BOX,
                             horizontal=not present, format_func=lambda f: t(f"lesson.explain.fill_{f}"))
    percent = controls[2].slider(t("lesson.explain.max_fraction"), UP_TOS[0], UP_TOS[-1], step=UP_TOS.step, key=UP_TO,
                                 format="%d%%")  # first: follow_link
    if present:  # what the test takes away at its last step, before it runs
        grid = cap.map_grid(layer)
        removed = round(percent / 100 * grid[0] * grid[1])
        x = lesson.remove_patches(cap.input, lesson.ranking(cap, layer, head)[:removed], grid, model.patch,
                                  lesson.fill_image(cap.input, fill, model.patch))
        preview.image(lesson.to_picture(model, x), width=DISPLAY_PX,
                      caption=f"{t('lesson.explain.attended')} · {removed}/{grid[0] * grid[1]}")
    asked = (*key, layer, head, fill, percent)
    if test.button(t("lesson.explain.run", layer=layer + 1), key="perturb_run", type="primary"):
        st.session_state["perturb_asked"] = asked
    if st.session_state.get("perturb_asked") != asked:
        test.caption(t("lesson.explain.press"))
        return
    # ~10 s of CPU: through the server's shared queue, so a class pressing at once costs one run per setting
    result = heavy.run(
        "perturbation", key, (layer, head, fill, percent),
        lambda: lesson.perturbation(model, cap, layer, head, fill=fill, max_fraction=percent / 100),
        t("lesson.explain.running"),
    )

    if result.metric == "probability":
        change_title = t("lesson.explain.prob_drop", label=model.labels[result.target], p=result.base_probability)
    else:
        change_title = t("lesson.explain.cosine")
    order_attended, order_random = t("lesson.explain.attended"), t("lesson.explain.random", n=len(result.random))
    percent_removed = 100 * result.fractions
    lines = pd.DataFrame({
        "removed": np.concatenate([percent_removed, percent_removed]),
        "change": np.concatenate([result.attended, result.random_mean]),
        "order": [order_attended] * len(percent_removed) + [order_random] * len(percent_removed),
    })
    band = pd.DataFrame({"removed": percent_removed, "lo": result.random.min(0), "hi": result.random.max(0)})
    colours = alt.Scale(domain=[order_attended, order_random], range=["#d62728", "#7f7f7f"])
    chart = (
        alt.Chart(band).mark_area(opacity=0.2, color="#7f7f7f").encode(x="removed:Q", y="lo:Q", y2="hi:Q")
        + alt.Chart(lines).mark_line(point=True).encode(
            x=alt.X("removed:Q", title=t("lesson.explain.removed_axis")),
            y=alt.Y("change:Q", title=t("lesson.explain.change_axis")),
            color=alt.Color("order:N", scale=colours, title=None, legend=alt.Legend(orient="top", labelLimit=500)),
            tooltip=[alt.Tooltip("order:N", title=t("lesson.explain.order")),
                     alt.Tooltip("removed:Q", format=".0f", title=t("lesson.explain.removed_axis")),
                     alt.Tooltip("change:Q", format=".4f", title=t("lesson.explain.change_axis"))],
        )
    ).properties(height=340)
    left, right = st.columns([3, 2], gap="large")
    left.altair_chart(described(chart), width="stretch")
    left.caption(change_title)
    filled = lesson.fill_image(cap.input, fill, model.patch)
    last = result.removed[-1]
    with right:
        pics = st.columns(2)
        for col, order, caption in (
            (pics[0], result.order, order_attended), (pics[1], result.random_orders[0], t("lesson.explain.random_one"))
        ):
            x = lesson.remove_patches(cap.input, order[:last], cap.grid, model.patch, filled)
            col.image(render.enlarge(lesson.to_picture(model, x), 224), caption=f"{caption} · {last}/{result.num_patches}")
    st.info(lesson.race_sentence(result.race, st.session_state.get("lang") or i18n.DEFAULT))
    st.caption(t("lesson.explain.caveats"))


def all_maps(model: Model, cap: Capture, key: tuple) -> None:
    """The same test for every map the app draws, measured on this photo (the Explore page's
    "Does attention explain?" view; one shared job, so either page's result serves both)."""
    from attnviz_app.views import faithfulness as faith_view

    st.subheader(t("lesson.explain.all_maps_title"))
    st.markdown(t("lesson.explain.all_maps_intro"))
    fills, why_not = faith_view.fills_for(model)
    if why_not:
        st.caption(why_not)
    result = faith_view.measure_or_wait(model, cap, key, fills[0], False, "lesson_faith")
    if result is not None:
        faith_view.results(result)


# --- The page ----------------------------------------------------------------------------------

def page() -> None:
    """The page, in a function, as Explore's: the run's capture and pictures go when it returns."""
    present = classroom.presenting("classroom.present_help_lesson")
    classroom.chrome(present, lesson=True)
    settings = ui.model_settings()

    labels = [t(f"lesson.tab{i}") for i in range(1, 8)]
    if present:  # the projector: no title, larger type, the photo's controls folded, the join box on the right; all
        # of it in a band ~190 px high, so that each step's picture and formula fit under the tabs on a 720 px screen
        photo_col, choice_col, panel = st.columns([0.45, 2.1, 2.2], gap="medium")
        source_col, *step_cols = choice_col.columns([1.3, 0.65, 0.65])
        for column, key, by, shortcut in zip(step_cols, ("step_prev", "step_next"), (-1, 1), ("Left", "Right")):
            column.button(t(f"classroom.{key}"), key=key, on_click=next_step, args=(labels, by), width="stretch",
                          shortcut=shortcut)  # a remote clicker's arrow keys walk the lesson
        classroom.leave_button(panel)
        photo_place = source_col.expander(t("input.source"))
    else:
        st.title(t("lesson.title"))
        st.caption(t("lesson.subtitle"))
        photo_col, choice_col = st.columns([1, 3])
        photo_place = choice_col

    model = ui.model_or_stop(settings)
    checked, cap, cap_key, recall = ui.capture_or_stop(model, settings, place=photo_place, more=sources.MORE)
    if not cap.uniform:  # the lesson's steps follow one N × N matrix per layer over one token grid
        st.info(t("lesson.one_grid", model=model.public_name, layers=cap.num_layers, stages=len(cap.stages),
                  grids=listed(f"{cap.layout(s[0]).grid[0]} × {cap.layout(s[0]).grid[1]}" for s in cap.stages)))
        return
    view = model.view(checked.image, settings.fit)
    caption = t("lesson.photo_caption", size=model.size, h=cap.grid[0], w=cap.grid[1])
    photo_col.image(view, caption=None if present else caption,  # the projector: step 1 says the sizes
                    width=min(view.width, 280))  # its own size: a phone's one column no longer stretches it to the full width
    with choice_col:
        layer_col, head_col = st.columns(2)
        if not 1 <= st.session_state.get(links.LESSON_LAYER, 1) <= cap.num_layers:  # a link's, or a bigger model's
            st.session_state.pop(links.LESSON_LAYER)
        ui.first_value(links.LESSON_LAYER, cap.num_layers)
        layer = layer_col.slider(t("lesson.layer"), 1, cap.num_layers, key=links.LESSON_LAYER) - 1
        head = remembered_choice(head_col.selectbox, t("lesson.head"), list(range(cap.num_heads)), key=links.LESSON_HEAD,
                                 format_func=lambda h: t("lesson.head_n", n=h + 1))

    tabs, step = step_tabs(labels)
    photo = ui.photo_link(recall, present)
    follow_link(cap)
    words = link_words(cap)
    linked = links.choices(photo, st.session_state["lang"], layer=layer + 1, head=head + 1, step=step + 1,
                           query=words.pop("query", None), **settings.linked, controls=words)
    links.publish(linked)  # the address opens this step of the lesson, on this photo, layer, head and language
    if present:
        with panel:
            classroom.join_box(linked, page=LESSON_PATH)
    opened = not st.session_state.get("_lesson_opened")
    st.session_state["_lesson_opened"] = True
    if opened and step and not present:  # opened on a later step (a link, the QR code): that step first, on a phone too
        classroom.bring_to_top(f'[class*="st-key-{links.LESSON_STEP}-"]')
    with tabs[0]:
        step_qkv(model, cap, layer, head, present)
    with tabs[1]:
        step_by_hand(present)
    with tabs[2]:
        step_scale(present)
    with tabs[3]:
        step_pair(model, cap, view, layer, head, present)
    with tabs[4]:
        step_heads(cap, view, layer, present)
    with tabs[5]:
        step_cost(model, present)
    with tabs[6]:
        step_not_explanation(model, cap, cap_key, layer, present)
        all_maps(model, cap, cap_key)  # every map on this photo, whether or not the test above was run


page()
