"""Streamlit wiring shared by the app's pages: language, cached model and capture, image input.

Only glue lives here; every computation is a call into :mod:`attnviz`. Cached objects are shared by
all browser sessions and are never mutated.
"""
from __future__ import annotations

import gc
import hashlib
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import attnviz
from attnviz import i18n
from attnviz import runtimes, serving, weightfiles
from attnviz.adapters import family_of_name
from attnviz.errors import HubUnavailable, ModelError
from attnviz.images import KIND_IDS, CheckedImage, ImageError
from attnviz.shared_photos import SharedPhotos

from . import tuning
from .priority import priority
from .settings import DEFAULT_PHOTO, DEFAULT_SIZES, NATIVE, Settings
from .text import device_label, t

CAPTURE_CACHE_ENTRIES = 12  # ≤ 12 × 54 MB at 518 px; ≤ 12 × 8 MB at 196 px


# Choices that must outlive a run in which their widget is not drawn: moving to the other page, or the
# short run while a new upload arrives (the page stops early, and Streamlit would forget Layer and Head).
KEPT_KEYS = (
    "lang", "model_choice", "size", "fit", "device", "source", "sample",
    "layer", "head", "view", "alpha", "cmap", "smooth", "beginner", "shared_photo",
)


def keep_choices() -> None:
    """Keep the sidebar's choices through runs that do not draw their widgets (another page, an early stop)."""
    # Streamlit forgets a widget's value after a run that did not draw it; re-assigning keeps it.
    st.session_state["lang"] = st.session_state.get("lang") or i18n.DEFAULT
    for key in KEPT_KEYS:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def first_value(key: str, value: object) -> None:
    """A kept widget's value before its first draw. keep_choices() sets kept keys through session state, and a
    widget drawn with a value of its own as well makes Streamlit log a warning with a stack trace: kept widgets
    take their first value from here instead."""
    st.session_state.setdefault(key, value)


def language_picker() -> None:
    """Sidebar: the language of every page."""
    st.sidebar.selectbox("Language / 語言", list(i18n.LANGUAGES), format_func=i18n.LANGUAGES.get, key="lang",
                         placeholder="Choose / 選擇")  # in both languages, as its label (Streamlit's is English)


@st.cache_resource(show_spinner=False, max_entries=4)
def cached_model(
    name: str | None, size: int | None, checkpoint: str | None, content: str | None, device: str,
    runtime: str = "pytorch", _download: bool = False,
) -> attnviz.Model:
    # ``content`` (the checkpoint's sha256) is in the key: a file overwritten at the same path is a new model.
    model = attnviz.load_model(name, size, checkpoint=checkpoint, device=device, download=_download)
    # The owner's runtime (ATTNVIZ_RUNTIME), kept only where its q and k were checked exact at load: the
    # server's captures, the live camera and the class's uploads all run through this one model.
    model = runtimes.on_runtime(model, runtime, threads=tuning.threads())
    gc.freeze()
    return model


@st.cache_resource(show_spinner=False, max_entries=CAPTURE_CACHE_ENTRIES, ttl=3600)
def cached_capture(
    model_key: tuple, digest: str, fit: str, _model: attnviz.Model, _image: CheckedImage
) -> attnviz.Capture:
    # Keyed by (model, input size, image digest, fit); the model and image themselves are not hashed.
    with priority().foreground():  # live-camera frames wait meanwhile (attnviz_app/priority.py)
        return attnviz.capture(_model, _image.image, fit=fit)


IMAGE_CACHE_ENTRIES = 16  # each at most 4704 × 587 px (attnviz.photos.read_photo): ≤ 8.3 MB


@st.cache_resource(show_spinner=False, max_entries=IMAGE_CACHE_ENTRIES)
def checked_image(digest: str, side: int, name: str, _data: bytes, _model: attnviz.Model) -> CheckedImage | ImageError:
    """The photo decoded for ``_model`` exactly as the CLI and the library decode it, or the reason it
    cannot be used (never raises). Both are immutable.

    Keyed by the bytes' ``digest`` (computed once per run, so Streamlit does not hash the upload again)
    and the model's decode side.
    """
    try:
        with priority().foreground():
            return attnviz.read_photo(_data, _model, name)
    except ImageError as e:
        return e


def escape_markdown(text: str) -> str:
    """File names are shown inside Markdown messages: keep ``**x**[a](b).png`` literal."""
    return re.sub(r"([\\`*_{}\[\]()#+!<>|~-])", r"\\\1", text)


def image_message(error: ImageError) -> str:
    values = {k: escape_markdown(v) if isinstance(v, str) else v for k, v in error.values.items()}
    for word in ("kind", "format"):  # "a PDF document", "picture": phrases, said in the reader's language
        if values.get(word) in KIND_IDS:
            values[word] = t(f"images.kind_{KIND_IDS[error.values[word]]}")
    return t(f"images.{error.key}", **{**values, "formats": t("images.formats")})


def image_notes(checked: CheckedImage, model: attnviz.Model, fit: str) -> list[str]:
    """What a person should know about the photo: how it was decoded, how the model sees it, and how the model's
    input was guessed where its files did not say (its normalisation)."""
    notes = [*checked.note_keys, *attnviz.photos.view_notes(checked.image.size, model, fit), *model.note_keys]
    return [t(f"images.note_{key}", **values) for key, values in notes]


def owner_policy() -> serving.Policy:
    """What the server's owner allows (read from its environment on every run: cheap, and always current)."""
    try:
        return serving.policy()
    except ValueError as e:
        st.error(str(e))
        st.stop()


@st.cache_data(show_spinner=False, max_entries=64)
def file_digest(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """sha256 of a file, computed once per (path, size, modification time, inode)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def content_key(checkpoint: serving.Checkpoint) -> str:
    """One sha256 over the checkpoint's files: the cache key of what they hold, not of where they are.

    Only regular files are read (a pipe or a device would never end), and a settings file only when it
    is as small as one is (the budget has already bounded the weight files by what they hold).
    """
    parts = []
    for path in checkpoint.files():
        stat = weightfiles.regular_file(path)
        if path.suffix == ".json" and stat.st_size > weightfiles.MAX_JSON_BYTES:
            raise ModelError(f"{path.name} is over the {weightfiles.MAX_JSON_BYTES >> 20} MB a settings file may have.")
        parts.append(f"{path.name}:{file_digest(str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


@st.cache_data(show_spinner=False, max_entries=64)
def parameter_count(name: str, size: int | None, checkpoint: str | None, files: tuple[tuple[str, int, int, int], ...]) -> int:
    """Parameters of what would be loaded, counted without building it (:func:`attnviz.serving.model_parameters`);
    cached by the files' (path, size, mtime_ns, inode), so a file replaced in place is counted again."""
    return serving.model_parameters(name, size, None if checkpoint is None else Path(checkpoint))


def model_folder(name: str | None) -> str | None:
    """The folder a family's model name points at (``"hf:<folder>"`` → ``<folder>``), or None."""
    family = family_of_name(name)
    return None if family is None else family.spec(name)


def model_files(settings: Settings) -> tuple[Path, ...]:
    """The files the chosen model is made of: its checkpoint, or what its family loads from its folder."""
    family = family_of_name(settings.name)
    if family is not None:
        return () if family.files is None else family.files(family.spec(settings.name))
    return () if settings.checkpoint is None else (Path(settings.checkpoint),)


def check_budget(settings: Settings, limit: int) -> None:
    """Refuse (OverBudget) anything over the owner's parameter budget before any memory is allocated."""
    if settings.name is None:
        return  # the offline default: 22 M parameters
    stats = [(str(p), s.st_size, s.st_mtime_ns, s.st_ino) for p in model_files(settings) if p.exists()
             for s in [weightfiles.regular_file(p)]]  # a file removed since it was listed: the count says so
    count = parameter_count(settings.name, settings.size, settings.checkpoint, tuple(stats))
    serving.check_budget(settings.label or settings.name, count, limit)


def model_label(choice: str) -> str:
    if choice == "default":
        return t("model.default_label")
    if choice.startswith("ckpt:"):
        return t("serving.checkpoint_label", name=choice[5:])
    return choice


def model_settings(folded: bool = False) -> Settings:
    """Sidebar: model, input size, fit, device — the same on every page; ``folded`` (beginner mode): in a closed
    expander, which keeps every choice.

    The Model box offers only what the server's owner allows (attnviz.serving): the offline default,
    hub models that are cached (or all of them when downloads are allowed), and the owner's
    checkpoints. A visitor never types a path or an architecture.
    """
    if folded:
        side = st.sidebar.expander(t("model.header"))
    else:
        side = st.sidebar
        side.header(t("model.header"))
    owner = owner_policy()
    checkpoints = {f"ckpt:{c.label}": c for c in serving.list_checkpoints(owner.checkpoints)}
    hub = [n for n in attnviz.HUB_MODELS if owner.allow_downloads or serving.hub_cached(n)]
    choices = ["default", *hub, *checkpoints]
    revert = st.session_state.pop("_model_revert", None)
    if revert is not None:  # the last run could not load the chosen model: the box goes back to the one shown
        st.session_state["model_choice"], size, st.session_state["_model_notice"] = revert
        st.session_state["size"] = NATIVE if size is None else size
    if st.session_state.get("model_choice", "default") not in choices:  # e.g. a checkpoint the owner removed
        st.session_state["model_choice"] = "default"
    choice = side.selectbox(
        t("model.choose"), choices, format_func=model_label, key="model_choice", help=t("serving.model_help"),
        placeholder=t("classroom.choose"),
    )
    name = checkpoint = content = None
    if choice in checkpoints:
        entry = checkpoints[choice]
        name, checkpoint = (entry.arch, None) if entry.is_folder else (entry.arch, str(entry.path))
    elif choice != "default":
        name = choice
    sizes = DEFAULT_SIZES if name is None else (NATIVE, 224, 448)
    if st.session_state.get("size", sizes[0]) not in sizes:  # a size the other model offered: keep the box valid
        st.session_state["size"] = sizes[0]
    size = side.selectbox(
        t("model.size"), sizes, format_func=lambda s: t("model.native") if s == NATIVE else f"{s} px", key="size",
        placeholder=t("classroom.choose"),
    )
    size = None if size == NATIVE else size
    fit = side.radio(
        t("model.fit"), ["crop", "squash"], format_func=lambda f: t(f"model.fit_{f}"), key="fit",
        help=t("model.fit_help"),
    )
    devices = ["cuda", "cpu"] if attnviz.models.torch.cuda.is_available() else ["cpu"]  # the GPU first, as load_model
    device = side.selectbox(t("model.device"), devices, key="device", format_func=device_label,
                            help=t("model.device_help"), placeholder=t("classroom.choose")) if len(devices) > 1 else "cpu"
    if choice in checkpoints:
        entry = checkpoints[choice]
        try:  # never read through a file the budget will refuse (a 7B checkpoint is 28 GB)
            if serving.checkpoint_parameters(entry.files()) <= owner.max_params:
                content = content_key(entry)
        except (OSError, ModelError):  # removed or damaged since it was listed: loading it will say so
            content = None
    return Settings(name, size, checkpoint, device, fit, content, choice, model_label(choice))


def _not_loaded(error: attnviz.ModelError, settings: Settings, shown: str) -> str:
    """One sentence: what could not be loaded, why, and that the page stays on ``shown``."""
    model, shown = escape_markdown(settings.label or str(settings.name)), escape_markdown(shown)
    if isinstance(error, serving.OverBudget):
        return t("serving.over_budget", model=model, params=error.params / 1e6, limit=error.limit / 1e6, shown=shown)
    if isinstance(error, HubUnavailable):
        return t("serving.hub_unavailable", model=model, shown=shown)
    reason = str(error)
    for secret in (settings.checkpoint, model_folder(settings.name)):
        if secret:  # a visitor sees the owner's file or folder by name, never where it is on the server
            reason = reason.replace(secret, Path(secret).name)
    return t("serving.not_loaded", model=model, reason=escape_markdown(reason), shown=shown)


def load(settings: Settings) -> attnviz.Model:
    """The chosen model, checked against the owner's budget first.

    When it cannot be loaded, the Model box goes back to the model shown before (or the default), with
    one sentence saying why: the page reruns with that model (a ModelError if the default itself fails).
    """
    owner = owner_policy()
    with st.spinner(t("model.loading")):
        try:
            check_budget(settings, owner.max_params)
            model = cached_model(*settings.key, owner.runtime, _download=owner.allow_downloads)
        except attnviz.ModelError as e:
            shown = st.session_state.get("_shown_model", ("default", DEFAULT_SIZES[0]))
            if shown == (settings.choice, settings.size):
                shown = ("default", DEFAULT_SIZES[0])
            if settings.name is None:
                raise  # the default itself failed: nothing to go back to
            st.session_state["_model_revert"] = (*shown, _not_loaded(e, settings, model_label(shown[0])))
            st.rerun()
    st.session_state["_shown_model"] = (settings.choice, settings.size)
    return model


def image_input(model: attnviz.Model | None = None, settings: Settings | None = None,
                more: Mapping[str, tuple[str, Callable]] | None = None, row: bool = False) -> tuple[bytes, str] | None:
    """Sample photo, upload, camera or live camera (and ``more``: name → (label key, source function),
    e.g. the video, :mod:`attnviz_app.sources`): the raw bytes and a display name. ``row``: the choice of source
    and the sample box side by side (a wide screen's first view keeps its height for the heatmap)."""
    more = more if model is not None and more else {}
    shared = st.session_state.get("shared_photo")  # a link's shared photo (the teacher's, on a phone)
    sources = ["sample", *(["shared"] if shared else []), "upload", "camera", *(["live"] if model is not None else []),
               *more]
    choice, box = st.columns([5, 2], vertical_alignment="bottom") if row else (st.container(), st.container())
    source = choice.radio(
        t("input.source"), sources,
        format_func=lambda s: t(more[s][0]) if s in more else t("live.source" if s == "live" else f"input.{s}"),
        horizontal=True, key="source",
    )
    if source in more:
        return more[source][1](model, settings)
    if source == "live":
        from . import live  # WebRTC is loaded only for the live camera

        return live.live_source(model, settings)
    if source == "shared":
        photo = shared_photos().open(shared)
        if photo is None:  # forgotten (its time is up, or the server restarted): say so, no traceback
            st.warning(t("input.shared_gone", hours=round(shared_photos().keep_s / 3600)))
            return None
        return photo.data, photo.filename
    if source == "upload":
        # No extension filter: the bytes decide, and a bad file gets our own one-sentence message.
        up = st.file_uploader(t("input.upload"), help=t("input.upload_help"), key="upload")
        return (up.getvalue(), up.name) if up is not None else None
    if source == "camera":
        shot = st.camera_input(t("input.camera"), key="camera")
        return (shot.getvalue(), "camera.jpg") if shot is not None else None
    first_value("sample", DEFAULT_PHOTO)
    sample = box.selectbox(t("input.sample"), list(attnviz.photos.SAMPLES), format_func=lambda s: t(f"samples.{s}"), key="sample",
                          placeholder=t("classroom.choose"))
    return attnviz.photos.sample(sample).read_bytes(), f"{sample}.jpg"


@st.cache_resource(show_spinner=False)
def shared_photos() -> SharedPhotos:
    """The server's one store of photos presenters share with their class (attnviz.shared_photos)."""
    return SharedPhotos()


def photo_link(recall: Recall, present: bool) -> str | None:
    """The address's ``photo``: a sample's name, the shared photo's name, or — in presenter view, whose QR code
    takes the address to the class's phones — a new shared name for the upload or camera shot shown. Otherwise
    None: an upload a visitor did not present stays theirs."""
    source = st.session_state.get("source")
    if source == "sample":
        return st.session_state.get("sample")
    if source == "shared":
        return st.session_state.get("shared_photo")
    if present and source in ("upload", "camera"):
        return shared_photos().share(recall.data, recall.filename, digest=recall.key[1])  # hashed once, per upload
    return None


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_or_stop(settings: Settings) -> attnviz.Model:
    """The chosen model (saying in one sentence why an earlier choice was not loaded); a one-line error
    and a stop if not even the offline default loads."""
    try:
        model = load(settings)
    except ModelError as e:  # the offline default itself is missing or damaged
        st.error(str(e))
        st.stop()
    notice = st.session_state.pop("_model_notice", None)
    if notice:
        st.warning(notice)
    return model


@dataclass(frozen=True, eq=False)
class Recall:
    """A run's capture and the picture its model saw, got back later — when a download button is clicked —
    without holding them.

    A session keeps what its last run left behind (a download's callable, a select box's labels) until the
    tab closes; each holding its capture (8 MB at 196 px) and pictures, sixty open tabs held 0.5 GB. A
    Recall holds the capture weakly, and the photo's bytes (which the session's upload holds anyway): while
    the capture is in the server's cache it is found there, after that it is computed again, once.
    """

    model: attnviz.Model
    key: tuple  # the capture's cache key: (model, photo digest, fit)
    data: bytes
    filename: str
    captured: weakref.ref

    @property
    def fit(self) -> str:
        return self.key[2]

    def image(self) -> CheckedImage:
        checked = checked_image(self.key[1], attnviz.photos.decode_side(self.model), self.filename,
                                _data=self.data, _model=self.model)
        if isinstance(checked, ImageError):  # it was usable when the page ran: the same bytes decode the same
            raise checked
        return checked

    def capture(self) -> attnviz.Capture:
        cap = self.captured()
        return cap if cap is not None else cached_capture(*self.key, _model=self.model, _image=self.image())

    def view(self):
        """The S × S picture the model saw."""
        return self.model.view(self.image().image, self.fit)


def capture_or_stop(
    model: attnviz.Model, settings: Settings, place=None, more: Mapping[str, tuple[str, Callable]] | None = None,
    row: bool = False,
) -> tuple[CheckedImage, attnviz.Capture, tuple, Recall]:
    """Photo input (drawn in ``place``; ``row``: see :func:`image_input`), checks and the cached capture; a message
    and a stop otherwise.

    Also returns the capture's cache key (model, size, photo digest, fit) for caches built on it, and a
    :class:`Recall` of the capture for what is computed after the run (downloads).
    """
    with place if place is not None else st.container():
        picked = image_input(model, settings, more, row)
    if picked is None:
        st.info(t("input.waiting"))
        st.stop()
    data, filename = picked
    photo_digest = digest(data)
    checked = checked_image(photo_digest, attnviz.photos.decode_side(model), filename, _data=data, _model=model)
    if isinstance(checked, ImageError):
        st.error(image_message(checked))
        st.stop()
    for note in image_notes(checked, model, settings.fit):
        st.info(t("input.note", note=note))
    key = ((*settings.key, model.size), photo_digest, settings.fit)
    with st.spinner(t("capture.running")):
        cap = cached_capture(*key, _model=model, _image=checked)
    return checked, cap, key, Recall(model, key, data, filename, weakref.ref(cap))
