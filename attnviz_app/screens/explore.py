"""Explore: a photo's attention, layer by layer and head by head, in the view the reader picks."""
from __future__ import annotations

import streamlit as st

from attnviz import render
from attnviz.softmax import HEAD_FUSIONS
from attnviz_app import classroom, links, sources, ui, views
from attnviz_app.text import t
from attnviz_app.views.common import attending
from attnviz_app.views.query import link_name

VIEWS = views.registered()


def step(key: str, options: list, by: int, default) -> None:
    """Button callback (and the presenter view's arrow keys): the next or previous Layer / Head."""
    now = st.session_state.get(key, default)
    st.session_state[key] = options[(options.index(now) + by) % len(options)] if now in options else default


def _keep_head(heads: tuple[int, ...]) -> None:
    """Layer callback: a head the new layer lacks (a Swin's stage 1 has 3, its stage 4 has 24) becomes the mean.
    ``heads``: each layer's head count (numbers: a widget's callback outlives the run, a capture must not)."""
    head = st.session_state.get("head", "mean")
    if not isinstance(head, str) and head > heads[st.session_state["layer"] - 1]:
        st.session_state["head"] = "mean"


def place(cap, layer: int) -> str:
    """Where layer ``layer`` (0-based) is in a model with stages: its stage, block, grid and windows."""
    lay = cap.layout(layer)
    return t("view.place", stage=lay.stage + 1, block=lay.block + 1, h=lay.grid[0], w=lay.grid[1],
             windows=attending(lay))



def page() -> None:
    """The page, in a function: what one run makes (the capture, the photo, the model's view) are its locals and
    go when it returns. As the script's globals they stayed alive with the session, through every function the
    page left behind (a select box's labels, a download made when clicked): sixty open tabs held sixty
    captures (docs/classroom.md, "What the server holds")."""
    present = classroom.presenting()
    beginner = classroom.beginner_mode()
    classroom.chrome(present)
    settings = ui.model_settings(folded=beginner)
    offered = [name for name, view in VIEWS.items() if view.beginner or not beginner]
    if st.session_state.get("view", offered[0]) not in offered:  # a research view, left for beginner mode
        st.session_state["view"] = offered[0]
    # The view chosen in the previous run (Streamlit has already applied any change): the display controls
    # it does not read are disabled, Layer and Head hidden.
    chosen_before = VIEWS.get(st.session_state.get("view"), next(iter(VIEWS.values())))
    used = chosen_before.used(st.session_state)
    unused = t("classroom.unused")
    st.sidebar.header(t("view.display"))
    for spec in views.DISPLAY:  # a link's value, else each one's first (they take no ctx)
        spec.prepare(st.session_state, None)
    alpha = st.sidebar.slider(t("view.opacity"), 0.0, 1.0, step=0.05, key="alpha", disabled=views.OPACITY not in used,
                              help=None if views.OPACITY in used else unused)
    if beginner:  # the picture's colours and smoothing as they open: one control fewer to explain each
        cmap, smooth = st.session_state["cmap"], st.session_state["smooth"]
    else:
        cmap = st.sidebar.selectbox(t("view.colormap"), render.COLORMAPS, key="cmap", placeholder=t("classroom.choose"),
                                    disabled=views.COLOURS not in used, help=None if views.COLOURS in used else unused)
        smooth = st.sidebar.toggle(t("view.smooth"), key="smooth", disabled=views.SMOOTH not in used,
                                   help=t("view.smooth_help") if views.SMOOTH in used else unused)

    if present:
        result, panel = st.columns([3, 2], gap="medium")
        classroom.leave_button(panel)
        photo_place = panel.expander(t("input.source"))
    else:
        with st.container(key="intro"):  # compact (classroom.BASE_CSS): the heatmap starts on the first screen
            st.title(t("app.title"))
            st.caption(t("app.subtitle"))
        photo_place = None

    model = ui.model_or_stop(settings)
    checked, cap, cap_key, recall = ui.capture_or_stop(model, settings, place=photo_place, more=sources.MORE,
                                                       row=not present)
    if not present:  # the controls under the photo input and its notes, the view under them
        panel, result = st.container(), st.container()

    photo = ui.photo_link(recall, present)
    if "view" not in st.session_state and len(cap.stages) > 1 and not beginner:  # a model with stages opens on what its stages are
        st.session_state["view"] = "stages"
        used = VIEWS["stages"].used(st.session_state)  # its own boxes: no Layer, Head or their buttons
    kept = st.session_state.get("layer", cap.num_layers)
    if not 1 <= kept <= cap.num_layers:  # a kept choice from a deeper model: start this one at its last layer
        st.session_state.pop("layer", None)
        kept = cap.num_layers
    heads = [*HEAD_FUSIONS, *range(1, cap.heads(kept - 1) + 1)]  # the layer's own heads (a Swin's grow by stage)
    if st.session_state.get("head", "mean") not in heads:  # a kept head this layer lacks: the mean of its heads
        st.session_state.pop("head", None)

    with panel, st.container(key="controls"):
        sides = {}  # the presenter's big buttons: ◀ Layer ▶ and ▲ Head ▼ beside their boxes (←/→ and ↑/↓ press them)
        if present:
            for needs in (views.LAYER, views.HEAD):
                sides[needs] = st.columns([1, 5, 1], vertical_alignment="bottom") if needs in used else (None,) * 3
            layer_col, head_col = (sides[views.LAYER][1] or st.container()), (sides[views.HEAD][1] or st.container())
            view_col = st.container()
        else:
            layer_col, head_col, view_col = st.columns([3, 2, 2])
        if views.LAYER in used:
            ui.first_value("layer", cap.num_layers)
            layer = layer_col.slider(t("view.layer"), 1, cap.num_layers, key="layer",
                                     on_change=_keep_head, args=(tuple(lay.num_heads for lay in cap.layouts),))
            if len(cap.stages) > 1:  # where the layer is: its stage and block, and the grid it attends on
                layer_col.caption(place(cap, layer - 1))
        else:
            layer = st.session_state.get("layer", cap.num_layers)
        if views.HEAD in used:
            head = head_col.selectbox(
                t("view.head"), heads, key="head", placeholder=t("classroom.choose"),
                format_func=lambda h: t(f"view.head_{h}") if isinstance(h, str) else t("view.head_n", n=h),
            )
        else:
            head = st.session_state.get("head", "mean")
        for needs, options, first, pair in (
            (views.LAYER, list(range(1, cap.num_layers + 1)), cap.num_layers,
             (("layer_prev", "◀", -1, "Left"), ("layer_next", "▶", 1, "Right"))),
            (views.HEAD, heads, "mean", (("head_prev", "▲", -1, "Up"), ("head_next", "▼", 1, "Down"))),
        ):
            before, _, after = sides.get(needs, (None, None, None))
            for column, (key, arrow, by, shortcut) in zip((before, after), pair):
                if column is not None:
                    column.button(arrow, key=key, help=t(f"classroom.{key}"), on_click=step, args=(needs, options, by, first),
                                  width="stretch", shortcut=shortcut)
        chosen = view_col.selectbox(
            t("views.choose"), offered, key="view", placeholder=t("classroom.choose"),
            format_func=lambda v: t(f"views.{v}") + (t("classroom.classifier_only") if VIEWS[v].needs_classifier
                                                    and model.labels is None else ""),
        )
        if not used & {views.LAYER, views.HEAD} and not present:  # the projector keeps its height for the picture
            st.caption(t(VIEWS[chosen].no_layer_head))
    ctx = views.Context(
        model=model, cap=cap, view=model.view(checked.image, settings.fit), layer=layer - 1,
        head=head if isinstance(head, str) else head - 1, alpha=alpha, cmap=cmap, smooth=smooth, fit=settings.fit,
        cap_key=cap_key, present=present, narrow=classroom.narrow(), recall=recall, panel=panel if present else None,
        beginner=beginner,
    )
    with result, st.container(key="result"):
        refusal = VIEWS[chosen].refusal(ctx)
        if refusal is not None:  # what this model's layer lacks for the view, in one sentence
            st.info(refusal)
            shown = None
        else:
            shown = VIEWS[chosen].show(ctx)  # a view with its own Stage, Block and Head returns their words
    # after the view, which drops a linked value this capture does not offer (Linked.prepare)
    own = VIEWS[chosen].used(st.session_state)
    controls = links.controls(st.session_state, ctx, own, VIEWS[chosen].linked)
    if shown is not None:  # its own boxes name what it shows: not the page's Layer and Head
        controls |= shown
        layer_word, head_word, query = None, shown.pop("head", None), shown.pop("query", None)
        controls.pop("head", None), controls.pop("query", None)
    else:
        layer_word, head_word = layer, head
        query = link_name(cap, layer - 1) if VIEWS[chosen].reads_query and refusal is None else None
    linked = links.choices(photo, st.session_state["lang"], chosen, layer_word, head_word, query=query,
                           **settings.linked, controls=controls, beginner=beginner)
    links.publish(linked)
    classroom.bring_into_view(f"{cap_key[1]}:{chosen}:{present}")

    if present:
        with panel:
            classroom.join_box(linked)


page()
