"""Streamlit wiring shared by the app's pages: language, cached model and capture, image input.

Only glue lives here; every computation is a call into :mod:`attnviz`. Cached objects are shared by
all browser sessions and are never mutated.
"""
from __future__ import annotations

import gc
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import attnviz
from attnviz import i18n
from attnviz.errors import ModelError
from attnviz.images import CheckedImage, ImageError, open_image

ASSETS = Path(__file__).with_name("assets")
SAMPLES = {"cat": "cat.jpg", "coffee": "coffee.jpg", "astronaut": "astronaut.jpg", "rocket": "rocket.jpg"}
DEFAULT_SIZES = (196, 224, 448, 518)
CAPTURE_CACHE_ENTRIES = 12  # ≤ 12 × 54 MB at 518 px; ≤ 12 × 8 MB at 196 px


def t(key: str, **values: object) -> str:
    """Translate ``key`` into the language this browser session chose."""
    return i18n.text(st.session_state.get("lang") or i18n.DEFAULT, key, **values)


# Choices that must outlive a run in which their widget is not drawn: moving to the other page, or the
# short run while a new upload arrives (the page stops early, and Streamlit would forget Layer and Head).
KEPT_KEYS = (
    "lang", "model_choice", "ckpt_arch", "ckpt_path", "size", "fit", "device", "source", "sample",
    "layer", "head", "view", "alpha", "cmap", "smooth",
)


def language_picker() -> None:
    """Sidebar: the two pages (named in the chosen language) and the language switch."""
    # Streamlit forgets a widget's value after a run that did not draw it; re-assigning keeps it.
    st.session_state["lang"] = st.session_state.get("lang") or i18n.DEFAULT
    for key in KEPT_KEYS:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]
    st.sidebar.page_link("app.py", label=t("nav.explore"), icon=":material/visibility:")
    st.sidebar.page_link("pages/lesson.py", label=t("nav.lesson"), icon=":material/school:")
    st.sidebar.page_link("pages/dataset.py", label=t("dataset.nav"), icon=":material/photo_library:")
    st.sidebar.selectbox(
        "Language / 語言", list(i18n.LANGUAGES), format_func=i18n.LANGUAGES.get, key="lang"
    )


@st.cache_resource(show_spinner=False, max_entries=4)
def cached_model(name: str | None, size: int | None, checkpoint: str | None, device: str) -> attnviz.Model:
    model = attnviz.load_model(name, size, checkpoint=checkpoint, device=device)
    # torch, timm and the model live as long as the server. Freezing them out of the garbage collector's
    # sight keeps the full collection Streamlit runs after every script run at a few ms instead of
    # ~0.4 s, during which it held the GIL and the page's request for the new heatmap waited.
    gc.freeze()
    return model


@st.cache_resource(show_spinner=False, max_entries=CAPTURE_CACHE_ENTRIES, ttl=3600)
def cached_capture(
    model_key: tuple, digest: str, fit: str, _model: attnviz.Model, _image: CheckedImage
) -> attnviz.Capture:
    # Keyed by (model, input size, image digest, fit); the model and image themselves are not hashed.
    return attnviz.capture(_model, _image.image, fit=fit)


MAX_SIDE = 2048  # decoded photos are kept at most this large: ≤ 12.6 MB per cached entry
IMAGE_CACHE_ENTRIES = 16


@st.cache_resource(show_spinner=False, max_entries=IMAGE_CACHE_ENTRIES)
def checked_image(digest: str, name: str, _data: bytes) -> CheckedImage | ImageError:
    """The decoded image, or the reason it cannot be used (never raises). Both are immutable.

    Keyed by the bytes' ``digest`` (computed once per run), so Streamlit does not hash the upload again.
    """
    try:
        return open_image(_data, name, max_side=MAX_SIDE)
    except ImageError as e:
        return e


def escape_markdown(text: str) -> str:
    """File names are shown inside Markdown messages: keep ``**x**[a](b).png`` literal."""
    return re.sub(r"([\\`*_{}\[\]()#+!<>|~-])", r"\\\1", text)


def image_message(error: ImageError) -> str:
    values = {k: escape_markdown(v) if isinstance(v, str) else v for k, v in error.values.items()}
    return t(f"images.{error.key}", **{**values, "formats": t("images.formats")})


def image_notes(checked: CheckedImage) -> list[str]:
    return [t(f"images.note_{key}", **values) for key, values in checked.note_keys]


@dataclass(frozen=True)
class Settings:
    name: str | None
    size: int | None
    checkpoint: str | None
    device: str
    fit: str

    @property
    def key(self) -> tuple:
        return (self.name, self.size, self.checkpoint, self.device)


def model_settings() -> Settings:
    """Sidebar: model, input size, fit, device — the same on every page."""
    side = st.sidebar
    side.header(t("model.header"))
    choices = ["default", *attnviz.HUB_MODELS, "checkpoint"]
    labels = {"default": t("model.default_label"), "checkpoint": t("model.checkpoint_label")}
    choice = side.selectbox(t("model.choose"), choices, format_func=lambda c: labels.get(c, c), key="model_choice")
    name, checkpoint = (None, None) if choice == "default" else (choice, None)
    if choice == "checkpoint":
        name = side.text_input(t("model.arch"), value="vit_small_patch16_224", key="ckpt_arch")
        checkpoint = side.text_input(t("model.path"), key="ckpt_path") or None
        if not checkpoint:
            side.info(t("model.path_needed"))
            name = None
    sizes = DEFAULT_SIZES if name is None else (None, 224, 448)
    size = side.selectbox(
        t("model.size"), sizes, format_func=lambda s: t("model.native") if s is None else f"{s} px", key="size"
    )
    fit = side.radio(
        t("model.fit"), ["crop", "squash"], format_func=lambda f: t(f"model.fit_{f}"), key="fit",
        help=t("model.fit_help"),
    )
    devices = ["cpu", "cuda"] if attnviz.models.torch.cuda.is_available() else ["cpu"]
    device = side.selectbox(t("model.device"), devices, key="device") if len(devices) > 1 else "cpu"
    return Settings(name, size, checkpoint, device, fit)


def load(settings: Settings) -> tuple[attnviz.Model, str | None]:
    """The chosen model, or the offline default with the reason the chosen one failed."""
    with st.spinner(t("model.loading")):
        try:
            return cached_model(*settings.key), None
        except attnviz.ModelError as e:
            fallback = Settings(None, None, None, settings.device, settings.fit)
            if fallback.key == settings.key:
                raise  # the default itself failed: nothing to fall back to
            return cached_model(*fallback.key), str(e)


def image_input() -> tuple[bytes, str] | None:
    """Sample photo, upload or camera: the raw bytes and a display name."""
    source = st.radio(
        t("input.source"), ["sample", "upload", "camera"], format_func=lambda s: t(f"input.{s}"),
        horizontal=True, key="source",
    )
    if source == "upload":
        # No extension filter: the bytes decide, and a bad file gets our own one-sentence message.
        up = st.file_uploader(t("input.upload"), help=t("input.upload_help"), key="upload")
        return (up.getvalue(), up.name) if up is not None else None
    if source == "camera":
        shot = st.camera_input(t("input.camera"), key="camera")
        return (shot.getvalue(), "camera.jpg") if shot is not None else None
    sample = st.selectbox(t("input.sample"), list(SAMPLES), format_func=lambda s: t(f"samples.{s}"), key="sample")
    return (ASSETS / SAMPLES[sample]).read_bytes(), SAMPLES[sample]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_or_stop(settings: Settings) -> attnviz.Model:
    """The chosen model (or the default, with a warning saying why); a one-line error if none loads."""
    try:
        model, model_error = load(settings)
    except ModelError as e:  # the offline default itself is missing or damaged
        st.error(str(e))
        st.stop()
    if model_error:
        st.warning(t("model.fallback", reason=model_error))
    return model


def capture_or_stop(
    model: attnviz.Model, settings: Settings, place=None
) -> tuple[CheckedImage, attnviz.Capture, tuple]:
    """Photo input (drawn in ``place``), checks and the cached capture; a message and a stop otherwise.

    Also returns the capture's cache key (model, size, photo digest, fit) for caches built on it.
    """
    with place if place is not None else st.container():
        picked = image_input()
    if picked is None:
        st.info(t("input.waiting"))
        st.stop()
    data, filename = picked
    photo_digest = digest(data)
    checked = checked_image(photo_digest, filename, _data=data)
    if isinstance(checked, ImageError):
        st.error(image_message(checked))
        st.stop()
    for note in image_notes(checked):
        st.info(t("input.note", note=note))
    key = ((*settings.key, model.size), photo_digest, settings.fit)
    with st.spinner(t("capture.running")):
        cap = cached_capture(*key, _model=model, _image=checked)
    return checked, cap, key
