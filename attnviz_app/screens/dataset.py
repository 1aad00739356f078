"""Dataset page: a run of ``attnviz dataset`` — every head over many photos, and one head's photos.

The runs come only from the folder the server's owner names in ``ATTNVIZ_DATASETS``: a browser never
types a path on the server. Every file of a run is checked before it is used
(:func:`attnviz.runfiles.open_run`): a damaged part is left out with one sentence naming it, a run
that cannot be shown at all says why in one sentence, and the other runs still open.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import streamlit as st

from attnviz_app import startup

with startup.importing():
    import altair as alt
    import pandas as pd

    from attnviz_app import classroom, links, ui
    from attnviz_app.views.common import described, download_chart, table_layer, tooltip_table
    from attnviz import dataset, i18n, render, runfiles
    from attnviz.adapters import family_of_name
    from attnviz.errors import RunFileError
    from attnviz.images import ImageError
    from attnviz.models import ModelError
    from attnviz_app.settings import Settings
    from attnviz_app.text import listed, t

ROOT_VARIABLE = "ATTNVIZ_DATASETS"
EXPLORE = Path(__file__).with_name("explore.py")  # the way back for a visitor to a server with no runs
SAMPLE_IMAGES = 200  # per-image points sent to the browser: the chart stays light on big runs
SHOWN = 6  # photos shown for the chosen head
CAPTURE_ENTRIES = 12
RUN_ENTRIES = 4  # runs kept read: each at most runfiles.MAX_RUN_ROWS compact rows (~56 MB)
LEFT_OUT_SHOWN = 3  # sentences about left-out files; the rest are counted
ERRORS_SHOWN = 500  # rows of the errors table drawn (each is translated on every run)


@st.cache_resource(show_spinner=False, max_entries=RUN_ENTRIES)
def opened(out: str, _signature: tuple) -> tuple[runfiles.OpenedRun, pd.DataFrame]:
    # Keyed by the folder and its parts' signature, so a run that is still growing is read again. Shared
    # by every session and never changed: the heads frame is the compact one (28 bytes a row).
    run = runfiles.open_run(out)
    return run, run.heads.to_pandas()


@st.cache_resource(show_spinner=False, max_entries=CAPTURE_ENTRIES)
def reopened(out: str, path: str, digest: str, fit: str, model_key: tuple, _model):
    # model_key: the run's (model, size, checkpoint), so a run.json edited by hand is a new entry
    return dataset.reopen(_model, path, digest, fit, Path(out) / "captures")


def scatter(summary: pd.DataFrame, per_image: pd.DataFrame) -> alt.LayerChart:
    """One point per head (mean over photos); pointing at one shows that head's photos as small points."""
    hover = alt.selection_point(on="pointerover", fields=["layer", "head"], empty=False, clear="pointerout")
    # Fixed axes that hold every photo's point: axes that grew when a head's photos appear would move
    # the head away from the pointer, which hides them again.
    both = pd.concat([summary, per_image])
    x = alt.X("distance_px:Q", title=t("dataset.distance_axis"),
              scale=alt.Scale(domain=[0, float(both["distance_px"].max()) * 1.05], nice=False))
    y = alt.Y("entropy:Q", title=t("dataset.entropy_axis"),
              scale=alt.Scale(domain=[0, float(both["entropy"].max()) * 1.05], nice=False))
    layer_colour = alt.Color("layer:Q", title=t("dataset.layer"), scale=alt.Scale(scheme="viridis"),
                             legend=alt.Legend(format="d", tickMinStep=1))
    tooltip = [alt.Tooltip("layer:O", title=t("dataset.layer")), alt.Tooltip("head:O", title=t("dataset.head")),
               alt.Tooltip("distance_px:Q", format=".1f", title=t("dataset.distance_axis")),
               alt.Tooltip("entropy:Q", format=".2f", title=t("dataset.entropy_axis")),
               alt.Tooltip("images:Q", title=t("dataset.images"))]
    heads = alt.Chart(summary).mark_circle(size=110, opacity=0.9, stroke="black", strokeWidth=0.5).encode(
        x=x, y=y, color=layer_colour, tooltip=tooltip,
    ).add_params(hover)
    photos = alt.Chart(per_image).mark_circle(size=45, opacity=0.8, color="#d62728").encode(
        x=x, y=y,
        tooltip=[alt.Tooltip("name:N", title=t("dataset.photo")),
                 alt.Tooltip("distance_px:Q", format=".1f", title=t("dataset.distance_axis")),
                 alt.Tooltip("entropy:Q", format=".2f", title=t("dataset.entropy_axis"))],
    ).transform_filter(hover)
    return alt.layer(table_layer(tooltip_table(summary, tooltip)), photos, heads).properties(height=420)


def lang() -> str:
    return st.session_state.get("lang") or i18n.DEFAULT


def said(key: str, values: dict, markdown: bool = True) -> str:
    """A run file's problem (``dataset.<key>``) in the reader's language; names as file names only."""
    values = dict(values)
    if isinstance(values.get("name"), str):
        values["name"] = Path(values["name"]).name if os.path.isabs(values["name"]) else values["name"]
    if markdown:
        values = {k: ui.escape_markdown(v) if isinstance(v, str) and k not in ("kind", "expected") else v
                  for k, v in values.items()}
    return runfiles.sentence(lang(), key, values)


def problem_text(error: RunFileError) -> str:
    return said(error.key, error.values)


def error_text(row: dict) -> str:
    """An errors row in the reader's language (the English sentence when the reason is not catalogued)."""
    try:
        values = json.loads(row["error_values"] or "{}")
        values["name"] = Path(values.get("name", row["path"])).name
        key = row["error_key"]
        if key in ("not_read", "unusable") or key.startswith("file_"):
            return said(key, values, markdown=False)
        return t(f"images.{key}", **{**values, "formats": t("images.formats")})
    except (KeyError, IndexError, ValueError, TypeError, AttributeError):
        return row["error"]


def shown_model(info: runfiles.RunInfo) -> str:
    """The run's model as a visitor may see it: no path on the server (a folder by its name only)."""
    name = info.model_name or info.model
    if not name:
        return t("model.default_label")
    family = family_of_name(name)
    if family is not None and os.path.isabs(family.spec(name)):
        return f"{family.prefix}{Path(family.spec(name)).name}"
    return Path(name).name if os.path.isabs(name) else name


def run_model(info: runfiles.RunInfo):
    """The run's model, checked like the Model box's: the checkpoint a regular file, the owner's budget
    before any memory is allocated; then cached by the checkpoint's content. ModelError or RunFileError."""
    checkpoint = info.checkpoint
    content = None
    if checkpoint:
        shown = Path(checkpoint).name
        stat = runfiles.check_file(checkpoint, None, shown)  # never hash a FIFO or /dev/zero
        settings = Settings(info.model, info.size, checkpoint, "cpu", info.fit, label=info.model or shown)
        ui.check_budget(settings, ui.owner_policy().max_params)  # bounds what is hashed below
        content = ui.file_digest(checkpoint, stat.st_size, stat.st_mtime_ns, stat.st_ino)
    elif info.model:
        ui.check_budget(Settings(info.model, info.size, None, "cpu", info.fit, label=shown_model(info)),
                        ui.owner_policy().max_params)
    return ui.cached_model(info.model, info.size, checkpoint, content, "cpu", ui.owner_policy().runtime)


def model_problem(error: Exception, info: runfiles.RunInfo) -> str:
    """Why the run's model cannot be loaded, without the server's paths."""
    reason = problem_text(error) if isinstance(error, RunFileError) else str(error)
    for secret in (info.checkpoint, ui.model_folder(info.model)):
        if secret:
            reason = reason.replace(secret, Path(secret).name)
    if not isinstance(error, RunFileError):
        reason = ui.escape_markdown(reason)
    return t("dataset.map_model", reason=reason)


def page() -> None:
    """The page, in a function (as screens/explore.py): what one run reads and draws are its locals, let go
    when it returns, not kept with the session in the script's globals."""
    st.title(t("dataset.title"))
    st.caption(t("dataset.subtitle"))

    root = os.environ.get(ROOT_VARIABLE)
    runs = dataset.find_runs(root) if root else []
    if not runs:  # a visitor: what the page is for, and the way back; the owner's how-to folded under it
        st.info(t("dataset.nothing_yet"))
        st.page_link(EXPLORE, label=t("dataset.back"), icon=":material/visibility:")
        with st.expander(t("dataset.for_owner")):
            st.markdown(t("dataset.no_runs", var=ROOT_VARIABLE, now=f"`{root}`" if root else t("dataset.unset"),
                          example=f"${ROOT_VARIABLE}/my-run"))
        st.stop()
    names = {str(run): run.name or str(run) for run in runs}
    linked_run = links.asked("run")  # a link names a run by its folder's name, as the box shows it
    if linked_run is not None and (found := [out for out, name in names.items() if name == linked_run]):
        st.session_state["dataset_run"] = found[0]
    out = st.selectbox(t("dataset.run"), list(names), format_func=names.get, key="dataset_run",
                       help=t("dataset.run_help", var=ROOT_VARIABLE), placeholder=t("classroom.choose"))
    try:
        with st.spinner(t("dataset.loading")):
            run, heads = opened(out, runfiles.signature(out))
    except RunFileError as e:  # run.json unusable, or a run too large to show: this run only
        st.error(problem_text(e))
        st.stop()
    for error in run.left_out[:LEFT_OUT_SHOWN]:
        st.warning(problem_text(error))
    if len(run.left_out) > LEFT_OUT_SHOWN:
        st.warning(t("dataset.left_out_more", count=len(run.left_out) - LEFT_OUT_SHOWN))
    info, images, errors = run.info, run.images, run.errors

    counts, about = st.columns([1, 2])
    counts.markdown(t("dataset.counts", images=images.num_rows, errors=errors.num_rows))
    if images.num_rows:
        about.markdown(t("dataset.about", model=ui.escape_markdown(shown_model(info)),
                         size=images["input_size"][0].as_py(), fit=t(f"model.fit_{info.fit}")))
    if images.num_rows == 0:
        st.info(t("dataset.empty"))
        st.stop()
    paths = images["path"].to_pylist()

    # --- Every head over the photos ---
    st.subheader(t("dataset.scatter_header"))
    summary = dataset.head_summary(heads).assign(layer=lambda d: d["layer"] + 1, head=lambda d: d["head"] + 1)
    shown_images = pd.Series(range(len(paths))).sample(min(SAMPLE_IMAGES, len(paths)), random_state=0)
    per_image = heads[heads["image"].isin(shown_images)].assign(
        layer=lambda d: d["layer"] + 1, head=lambda d: d["head"] + 1, name=lambda d: d["image"].map(lambda i: Path(paths[i]).name),
    )[["layer", "head", "name", "distance_px", "entropy"]]
    sampled = t("dataset.sampled", count=len(shown_images)) if len(shown_images) < len(paths) else ""
    heads_chart = scatter(summary, per_image)
    st.altair_chart(described(heads_chart), width="stretch")
    st.caption(t("dataset.scatter_caption", images=len(paths), sampled=sampled))
    download_chart(heads_chart.properties(title=t("dataset.scatter_header")), "dataset_heads_distance_entropy",
                   key="dataset_scatter")

    # --- One head's photos ---
    st.subheader(t("dataset.chosen_header"), anchor="chosen")
    if run.staged:  # the most-attended patch and the maps are on each layer's own grid
        grids = sorted(set(run.layer_grids), reverse=True)
        st.info(t("dataset.staged_note", heads=listed(dict.fromkeys(run.heads_per_layer)),
                  grids=listed(f"{h} × {w}" for h, w in grids)), icon=":material/info:")
    left, middle, right = st.columns([1, 1, 3])
    state = st.session_state
    asked_layer, asked_head = (links.asked_number(name) for name in ("layer", "head"))
    asked_ranking = links.asked("ranking")
    if asked_layer is not None and asked_layer <= run.num_layers:  # a link's layer, where this run has it
        state["dataset_layer"] = asked_layer
    if state.get("dataset_layer") not in range(1, run.num_layers + 1):  # first, or kept from a deeper run
        state["dataset_layer"] = run.num_layers
    layer = left.selectbox(t("dataset.layer"), range(1, run.num_layers + 1), key="dataset_layer",
                           placeholder=t("classroom.choose"))
    # With stages each layer has its own head count: the box of that count, so a kept head always exists.
    layer_heads = run.heads_of((layer or 1) - 1)
    head_key = f"dataset_head.{layer_heads}" if run.staged else "dataset_head"
    if asked_head is not None and asked_head <= layer_heads:
        state[head_key] = asked_head
    head = middle.selectbox(t("dataset.head"), range(1, layer_heads + 1), key=head_key,
                            placeholder=t("classroom.choose"))
    # The widget's key carries the language (translated labels would leave a kept radio with no choice
    # after a language switch); the choice itself is remembered without it.
    rankings = list(dataset.RANKINGS)
    if asked_ranking in rankings:
        state["dataset_ranking"] = asked_ranking
    remembered = st.session_state.get("dataset_ranking", rankings[0])
    ranking = right.radio(t("dataset.ranking"), rankings, index=rankings.index(remembered),
                          key=f"dataset_ranking.{st.session_state['lang']}", format_func=lambda r: t(f"dataset.ranking_{r}"))
    st.session_state["dataset_ranking"] = ranking
    links.publish(links.choices(None, st.session_state["lang"], layer=layer, head=head, run=names[out], ranking=ranking))
    if (asked_layer, asked_head, asked_ranking) != (None, None, None):  # a link to a head: its photos, not the title
        classroom.bring_to_top("#chosen")
    chosen = dataset.extremes(heads, (layer or 1) - 1, (head or 1) - 1, ranking, SHOWN)
    try:
        with st.spinner(t("model.loading")):
            model = run_model(info)
    except (ModelError, RunFileError) as e:  # the run's checkpoint may have moved since, or be no file at all
        st.error(model_problem(e, info))
        st.stop()
    digests = images["digest"].to_pylist()
    with st.spinner(t("dataset.maps_loading")):
        for i, row in enumerate(chosen.itertuples()):
            path = paths[row.image]
            name = ui.escape_markdown(Path(path).name)
            if i % 3 == 0:  # a new row of three: on a phone the columns stack, still in rank order
                columns = st.columns(3)
            with columns[i % 3]:
                try:
                    view, cap = reopened(out, path, digests[row.image], info.fit,
                                         (info.model, info.size, info.checkpoint), _model=model)
                except RunFileError as e:  # gone, or no longer a regular file of photo size
                    gone = e.key in ("file_missing", "file_loop")
                    st.warning(t("dataset.map_missing", name=name) if gone else problem_text(e))
                    continue
                except ImageError as e:  # readable, but not a picture the model can take: the sentence names it
                    st.warning(ui.image_message(e))
                    continue
                except dataset.RunError:
                    st.warning(t("dataset.map_changed", name=name))
                    continue
                except (ValueError, ModelError) as e:  # the model refuses the picture (e.g. a size it cannot take)
                    st.warning(t("dataset.map_unusable", name=name, reason=ui.escape_markdown(str(e))))
                    continue
                model_heads = tuple(lay.num_heads for lay in cap.layouts)
                if model_heads != tuple(run.heads_of(i) for i in range(run.num_layers)):
                    st.warning(t("dataset.model_layout", layers=run.num_layers, heads=run.num_heads,
                                 model_layers=cap.num_layers, model_heads=max(model_heads, default=0)))
                    break
                # the class token's row, or a model's stated alternative when it has no class token;
                # with stages at that layer's keys' grid
                grid_map = cap.summary_map(layer - 1, head - 1)  # (h, w)
                picture = render.enlarge(render.overlay(view, grid_map), 320)
                st.image(picture, caption=t("dataset.map_caption", name=Path(path).name, distance=row.distance_px,
                                            share=row.mass60_fraction), width="stretch")
    if run.staged:
        h, w = run.layer_grids[(layer or 1) - 1]
        st.caption(t("dataset.maps_note_staged", layer=layer, head=head, h=h, w=w))
    else:
        st.caption(t("dataset.maps_note", layer=layer, head=head))

    from attnviz_app import dataset_qk  # noqa: E402  (the Q/K map of the run's photos, issue #21)

    if run.staged:  # the map puts every photo's tokens of one head on one grid
        st.subheader(t("qkmap.dataset_header", layer=layer, head=head))
        st.info(t("dataset.qk_staged"), icon=":material/info:")
    else:
        dataset_qk.show(out, runfiles.signature(out), layer or 1, head or 1)

    # --- Files the run could not use ---
    if errors.num_rows:
        with st.expander(t("dataset.errors_header", count=errors.num_rows)):
            rows = errors.slice(0, ERRORS_SHOWN).to_pylist()
            st.dataframe(pd.DataFrame({
                t("dataset.error_file"): [Path(r["path"]).name for r in rows],
                t("dataset.error_reason"): [error_text(r) for r in rows],
            }), hide_index=True, width="stretch")
            if errors.num_rows > ERRORS_SHOWN:
                st.caption(t("dataset.errors_more", shown=ERRORS_SHOWN, count=errors.num_rows))


page()
