"""The "Video" photo source: upload a short clip, get it back with the class token's heatmap on every frame.

Streamlit wiring only; the work is :func:`attnviz.video.render_video`, run through the server's heavy-job
queue (:mod:`attnviz_app.heavy`) with a progress bar. The result plays in the page (``st.video``); a frame
scrubber shows any one of its frames, and "Freeze this frame" keeps the matching input frame as a
lossless PNG, which then takes the same path as an upload: every view and the lesson work on it.

Nothing is written to disk: the upload is read from its bytes, the result is written into memory and kept
in this session's state (one video per session, gone with the session), not in the server's cache of
results. The job asks the queue after every frame whether anyone still waits for it
(:meth:`attnviz.jobs.JobQueue.abandoned`): a closed tab, or a new request from the same tab, ends it.
"""
from __future__ import annotations

import hashlib
import io
import threading
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import attnviz
from attnviz import i18n
from attnviz import video as core
from attnviz.softmax import HEAD_FUSIONS

from . import heavy
from .settings import Settings
from .text import t
from .views.common import download_file

FROZEN_KEY = "video_frozen"  # (png bytes, file name, digest) of the frame kept
RESULT_KEY = "video_result"  # (job key, Rendered) of this session's last video
POLL_S = 0.5


@dataclass(frozen=True, eq=False)
class Rendered:
    """A finished video job: what it did and the MP4's bytes."""

    result: core.VideoResult
    mp4: bytes


class Progress:
    """Frames done of a running video job, shared by every session waiting for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.done, self.total = 0, None

    def update(self, done: int, total: int | None) -> None:
        with self._lock:
            self.done, self.total = done, total

    def read(self) -> tuple[int, int | None]:
        with self._lock:
            return self.done, self.total


@st.cache_resource(show_spinner=False, max_entries=32)
def progress_for(key: tuple) -> Progress:
    return Progress()


def message(error: core.VideoError) -> str:
    """The refusal in the reader's language (the core's English sentence where there is no translation)."""
    lang = st.session_state.get("lang") or i18n.DEFAULT
    key = f"video.error_{error.key}"
    return i18n.text(lang, key, **error.values) if error.key and key in i18n.catalogue(lang) else str(error)


def layer_and_head(model: attnviz.Model) -> tuple[int, object]:
    """The video's own Layer and Head (0-based out); the views below have theirs for a frozen frame."""
    heads = [*HEAD_FUSIONS, *range(1, model.num_heads + 1)]
    if st.session_state.get("video_layer", 0) > model.depth or st.session_state.get("video_head", "mean") not in heads:
        st.session_state.pop("video_layer", None)
        st.session_state.pop("video_head", None)
    left, right = st.columns([3, 2])
    layer = left.slider(t("view.layer"), 1, model.depth, model.depth, key="video_layer")
    head = right.selectbox(t("view.head"), heads, key="video_head",
                           format_func=lambda h: t(f"view.head_{h}") if isinstance(h, str) else t("view.head_n", n=h),
                           placeholder=t("classroom.choose"))
    return layer - 1, head if isinstance(head, str) else head - 1


def render(model, data: bytes, name: str, options: core.VideoSettings, progress: Progress, stop) -> Rendered:
    """The job: the whole video, drawn into memory; ``stop()`` ends it once nobody waits for it."""
    out = io.BytesIO()
    result = core.render_video(data, out, model, options, progress=progress.update, name=name, stop=stop)
    return Rendered(result, out.getvalue())


def wait_for(key: tuple, compute, working: str):
    """``compute()`` through the shared heavy-job queue (its result not cached there: it is this session's),
    with a progress bar of frames done."""
    from streamlit.runtime.scriptrunner_utils.exceptions import StopException

    from attnviz.jobs import JobCancelled

    jobs, owner = heavy.queue(), heavy._owner()
    bar = st.empty()
    progress = progress_for(key)
    for _ in range(3):
        job = jobs.submit(key, compute, owner, cache=False)
        try:
            while not jobs.wait(job, POLL_S):
                if job.state == "waiting":
                    bar.info(t("jobs.waiting", place=jobs.ahead(job) + 1, running=jobs.running, slots=jobs.workers))
                    continue
                done, total = progress.read()
                share = min(1.0, done / total) if total else 0.0
                bar.progress(share, text=t("video.working", done=done, total=total or "?") if total else working)
        except StopException:
            jobs.leave(owner)  # the run stopped (a rerun, a closed tab): the job stops unless someone else waits
            raise
        bar.empty()
        try:
            return job.result()
        except JobCancelled:  # dropped while it waited: ask again
            continue
        except core.VideoError as e:
            if e.key != "stopped":  # stopped as this session's previous run left it: this run asks again
                raise
    st.stop()


def freeze(source: bytes, index: int, name: str, digest: str) -> None:
    """Keep input frame ``index`` (upright) as PNG bytes: the page then explores it like a photo."""
    picture = core.frame_at(source, index, name)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    st.session_state[FROZEN_KEY] = (buffer.getvalue(), f"{Path(name).stem}-frame{index + 1}.png", digest)


def video_source(model: attnviz.Model, settings: Settings) -> tuple[bytes, str] | None:
    """Draw the video source; return the frozen frame (PNG bytes, name), or stop the page until there is one."""
    up = st.file_uploader(t("video.upload"), help=t("video.upload_help"), key="video_upload")
    if up is None:
        st.info(t("video.waiting"))
        st.stop()
    source = up.getvalue()  # in memory only: never written to disk
    digest = hashlib.sha256(source).hexdigest()
    kept = st.session_state.get(FROZEN_KEY)
    if kept is not None and kept[2] != digest:  # a new video: the old frozen frame goes
        st.session_state.pop(FROZEN_KEY, None)
        kept = None
    try:
        info = core.probe(source, name=up.name)  # the header only: refused before any frame is decoded
    except core.VideoError as e:
        st.error(message(e))
        st.stop()
    layer, head = layer_and_head(model)
    alpha, cmap = st.session_state.get("alpha", 0.6), st.session_state.get("cmap", "inferno")
    options = core.VideoSettings(layer=layer, head=head, alpha=alpha, cmap=cmap, fit=settings.fit)
    key = ("video", digest, settings.key, model.size, layer, head, alpha, cmap, settings.fit)
    done = st.session_state.get(RESULT_KEY)
    if done is not None and done[0] == key:
        rendered = done[1]
    else:
        st.session_state.pop(RESULT_KEY, None)  # the last video goes before the next is drawn
        jobs, progress = heavy.queue(), progress_for(key)
        try:
            rendered = wait_for(key, lambda: render(model, source, up.name, options, progress,
                                                    stop=lambda: jobs.abandoned(key)), t("video.working_start"))
        except core.VideoError as e:
            st.error(message(e))
            st.stop()
        st.session_state[RESULT_KEY] = (key, rendered)
    result, mp4 = rendered.result, rendered.mp4
    lang = st.session_state.get("lang") or i18n.DEFAULT
    played, still = st.columns([1, 1], gap="medium")  # side by side on a screen, one above the other on a phone
    with played:
        st.video(mp4, format="video/mp4")
        st.caption(t("video.result", note=core.describe(info, model, layer, head, result.every, result.fps, lang),
                     used=result.frames_out, total=result.frames_in, seconds=result.frames_out / result.fps))
        download_file(mp4, f"{Path(up.name).stem}_attention.mp4", key="video_download", mime="video/mp4",
                      label=t("video.download"))
    with still:
        frame = st.slider(t("video.frame"), 1, result.frames_out, 1, key="video_frame") if result.frames_out > 1 else 1
        st.image(core.frame_at(mp4, frame - 1), caption=t("video.frame_caption", frame=frame, of=result.frames_out,
                                                          input=(frame - 1) * result.every + 1))
        st.button(t("video.freeze"), help=t("video.freeze_help"), type="primary", key="video_freeze",
                  on_click=freeze, args=(source, (frame - 1) * result.every, up.name, digest))
    if kept is None:
        st.info(t("video.press_freeze"))
        st.stop()
    st.caption(t("video.frozen", name=kept[1]))
    return kept[0], kept[1]
