"""Dataset page: a run of ``attnviz dataset`` — every head over many photos, and one head's photos.

The runs come only from the folder the server's owner names in ``ATTNVIZ_DATASETS``: a browser never
types a path on the server. Every number is read from the run's tables (:mod:`attnviz.dataset`).
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

    from attnviz_app import ui
    from attnviz import dataset, render
    from attnviz.images import ImageError
    from attnviz.models import ModelError
    from attnviz_app.text import t

ROOT_VARIABLE = "ATTNVIZ_DATASETS"
SAMPLE_IMAGES = 200  # per-image points sent to the browser: the chart stays light on big runs
SHOWN = 6  # photos shown for the chosen head
CAPTURE_ENTRIES = 12


@st.cache_data(show_spinner=False, max_entries=4)
def tables(out: str, _signature: tuple) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    # Keyed by the folder and its parts' signature, so a run that is still growing is read again.
    run = dataset.read_run(out)
    return run.heads.to_pandas(), run.images.to_pandas(), run.errors.to_pandas()


@st.cache_resource(show_spinner=False, max_entries=CAPTURE_ENTRIES)
def reopened(out: str, path: str, digest: str, config_json: str, _model):
    config = json.loads(config_json)
    return dataset.reopen(_model, path, digest, config["fit"], Path(out) / "captures")


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
    heads = alt.Chart(summary).mark_circle(size=110, opacity=0.9, stroke="black", strokeWidth=0.5).encode(
        x=x, y=y, color=layer_colour,
        tooltip=[alt.Tooltip("layer:O", title=t("dataset.layer")), alt.Tooltip("head:O", title=t("dataset.head")),
                 alt.Tooltip("distance_px:Q", format=".1f", title=t("dataset.distance_axis")),
                 alt.Tooltip("entropy:Q", format=".2f", title=t("dataset.entropy_axis")),
                 alt.Tooltip("images:Q", title=t("dataset.images"))],
    ).add_params(hover)
    photos = alt.Chart(per_image).mark_circle(size=45, opacity=0.8, color="#d62728").encode(
        x=x, y=y,
        tooltip=[alt.Tooltip("name:N", title=t("dataset.photo")),
                 alt.Tooltip("distance_px:Q", format=".1f", title=t("dataset.distance_axis")),
                 alt.Tooltip("entropy:Q", format=".2f", title=t("dataset.entropy_axis"))],
    ).transform_filter(hover)
    return alt.layer(photos, heads).properties(height=420)


def error_text(row: dict) -> str:
    """An errors row in the reader's language (the English sentence when the reason is not catalogued)."""
    values = json.loads(row["error_values"] or "{}")
    values["name"] = Path(values.get("name", row["path"])).name
    try:
        if row["error_key"] in ("not_read", "unusable"):
            return t(f"dataset.{row['error_key']}", **values)
        return t(f"images.{row['error_key']}", **{**values, "formats": t("images.formats")})
    except (KeyError, IndexError):
        return row["error"]


st.title(t("dataset.title"))
st.caption(t("dataset.subtitle"))

root = os.environ.get(ROOT_VARIABLE)
runs = dataset.find_runs(root) if root else []
if not runs:
    st.info(t("dataset.no_runs", var=ROOT_VARIABLE, now=f"`{root}`" if root else t("dataset.unset"),
              example=f"${ROOT_VARIABLE}/my-run"))
    st.stop()
names = {str(run): run.name or str(run) for run in runs}
out = st.selectbox(t("dataset.run"), list(names), format_func=names.get, key="dataset_run",
                   help=t("dataset.run_help", var=ROOT_VARIABLE))
config = dataset.RunFolder(Path(out)).config()
with st.spinner(t("dataset.loading")):
    heads, images, errors = tables(out, dataset.signature(out))

counts, about = st.columns([1, 2])
counts.markdown(t("dataset.counts", images=len(images), errors=len(errors)))
if len(images):
    fit = t(f"model.fit_{config.get('fit', 'crop')}")
    about.markdown(t("dataset.about", model=ui.escape_markdown(config.get("model_name") or "?"), size=int(images["input_size"].iloc[0]),
                     fit=fit))
if images.empty:
    st.info(t("dataset.empty"))
    st.stop()

# --- Every head over the photos ---
st.subheader(t("dataset.scatter_header"))
summary = dataset.head_summary(heads).assign(layer=lambda d: d["layer"] + 1, head=lambda d: d["head"] + 1)
shown_paths = images["path"].sample(min(SAMPLE_IMAGES, len(images)), random_state=0)
per_image = heads[heads["path"].isin(shown_paths)].assign(
    layer=lambda d: d["layer"] + 1, head=lambda d: d["head"] + 1, name=lambda d: d["path"].map(lambda p: Path(p).name),
)[["layer", "head", "name", "distance_px", "entropy"]]
sampled = t("dataset.sampled", count=len(shown_paths)) if len(shown_paths) < len(images) else ""
st.altair_chart(scatter(summary, per_image), width="stretch")
st.caption(t("dataset.scatter_caption", images=len(images), sampled=sampled))

# --- One head's photos ---
st.subheader(t("dataset.chosen_header"))
num_layers, num_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
left, middle, right = st.columns([1, 1, 3])
layer = left.selectbox(t("dataset.layer"), range(1, num_layers + 1), index=num_layers - 1, key="dataset_layer")
head = middle.selectbox(t("dataset.head"), range(1, num_heads + 1), key="dataset_head")
# The widget's key carries the language (translated labels would leave a kept radio with no choice
# after a language switch); the choice itself is remembered without it.
rankings = list(dataset.RANKINGS)
remembered = st.session_state.get("dataset_ranking", rankings[0])
ranking = right.radio(t("dataset.ranking"), rankings, index=rankings.index(remembered),
                      key=f"dataset_ranking.{st.session_state['lang']}", format_func=lambda r: t(f"dataset.ranking_{r}"))
st.session_state["dataset_ranking"] = ranking
chosen = dataset.extremes(heads, layer - 1, head - 1, ranking, SHOWN)
try:
    with st.spinner(t("model.loading")):
        checkpoint = config.get("checkpoint")  # the owner's run chose it; cached by its content, like the Model box
        stat = Path(checkpoint).stat() if checkpoint else None
        content = ui.file_digest(checkpoint, stat.st_size, stat.st_mtime_ns, stat.st_ino) if stat else None
        model = ui.cached_model(config.get("model"), config.get("size"), checkpoint, content, "cpu")
except (ModelError, OSError) as e:  # the run's checkpoint may have moved since
    st.error(t("dataset.map_model", reason=e))
    st.stop()
with st.spinner(t("dataset.maps_loading")):
    for i, row in enumerate(chosen.itertuples()):
        name = Path(row.path).name
        if i % 3 == 0:  # a new row of three: on a phone the columns stack, still in rank order
            columns = st.columns(3)
        with columns[i % 3]:
            try:
                view, cap = reopened(out, row.path, row.digest, json.dumps(config, sort_keys=True), _model=model)
            except (OSError, ImageError):
                st.warning(t("dataset.map_missing", name=ui.escape_markdown(name)))
                continue
            except dataset.RunError:
                st.warning(t("dataset.map_changed", name=ui.escape_markdown(name)))
                continue
            # the class token's row, or a model's stated alternative when it has no class token
            grid_map = cap.summary_map(layer - 1, head - 1)  # (h, w)
            picture = render.enlarge(render.overlay(view, grid_map), 320)
            st.image(picture, caption=t("dataset.map_caption", name=name, distance=row.distance_px,
                                        share=row.mass60_fraction), width="stretch")
st.caption(t("dataset.maps_note", layer=layer, head=head))

# --- Files the run could not use ---
if len(errors):
    with st.expander(t("dataset.errors_header", count=len(errors))):
        st.dataframe(pd.DataFrame({
            t("dataset.error_file"): [Path(p).name for p in errors["path"]],
            t("dataset.error_reason"): [error_text(r) for r in errors.to_dict("records")],
        }), hide_index=True, width="stretch")
