"""The choices of the Explore page, the lesson and the dataset page in their address, so that a link opens what is on
the screen.

``/?view=query&layer=3&head=2&query=r3c11&photo=coffee&size=448&lang=zh-TW``: a session's first run takes these choices
from the address, before any widget is drawn, and every Explore or lesson run writes them back, so the address bar (and the
presenter view's join box and QR code) always holds a link to the view shown. ``photo`` is a sample's name or,
for a photo a presenter uploaded or took, the 22-character name it is shared under (attnviz/shared_photos.py). Layers and heads count from 1,
as on the page; ``head`` is also ``mean``, ``max`` or ``min``; ``query`` (on the views that draw the session's query
token: ``cls``, ``reg2``, ``r3c11`` for row 3, column 11) is that token; on the lesson (``/lesson?step=4&layer=12&head=1``)
``step`` is its tab, ``layer`` and ``head`` its own Layer and Head, ``query`` and ``key`` the pair step's patches,
``dk`` and ``divisor`` the scaling step's, ``rank``, ``remove`` and ``upto`` the last step's. ``model`` (the Model box's value) and ``size``
(``448``, ``native``) are written only where they are not what the page opens on, and a model is opened only where
the server offers it (attnviz_app/ui.py's Model box checks). The display controls a view reads (``opacity``,
``cmap``, ``smooth``) and a view's own controls (``/?view=rollout&layers=4-12&fusion=max``: each view declares them,
attnviz_app/views/base.py's ``Linked``) are written only where they differ from what the view opens on. The dataset
page (``/dataset?layer=3&head=2&run=r1&ranking=focused``) names its run by its folder's name. A visitor's upload
never travels; one shown in presenter view does, by its shared name. A value the page does not offer is left out, and the page opens on its own
default there.

Not Streamlit 1.67's ``bind="query-params"``: it names a parameter after the widget's key and writes a select box's
shown label, which is translated here, so a link made in Chinese would not open in English; and a view's widgets
are drawn only while it is shown, where a link must carry them from the first run.
"""
from __future__ import annotations

from urllib.parse import urlencode, urlsplit

import streamlit as st

import attnviz
from attnviz import i18n
from attnviz.shared_photos import NAME as SHARED_NAME
from attnviz.softmax import HEAD_FUSIONS

from .settings import NATIVE
from .views.base import DISPLAY, Context, Linked

# in the order a link writes them; "run" and "ranking" are the dataset page's
LINKED = ("view", "layer", "head", "query", "run", "ranking", "step", "photo", "model", "size", "beginner", "lang")
BEGINNER = "beginner"  # beginner mode (attnviz_app/classroom.py): ``beginner=1``, carried by the QR code to the phones
PRESENT = "present"  # the presenter view's own parameter (attnviz_app/classroom.py): the only one a page keeps
_RESTORED = "_links_restored"
_ASKED = "_links_asked"  # the address a session opened on, for pages that read it as they draw (asked())
# The lesson's Layer slider, its Head box's remembered choice and its step tab (screens/lesson.py): a link's
# layer, head and step open the lesson there
LESSON_LAYER, LESSON_HEAD, LESSON_STEP = "lesson_layer", "lesson_head", "lesson_step"
# the lesson's own names beside them (screens/lesson.py): the pair step's key patch (its query patch is ``query``), the
# scaling step's d_k and divisor, the last step's ranking head, fill and share removed
LESSON_NAMES = ("key", "dk", "divisor", "rank", "remove", "upto")


def memory_of(key: str) -> str:
    """The language-free key under which a lesson box of key ``key`` keeps its choice (the box's own key carries the
    language: screens/lesson.py, remembered_choice), and where a link's value for it goes."""
    return f"{key}.choice"


def restore() -> None:
    """Once per session, before any widget is drawn: the choices the address names, where the page offers them.
    Layer and head are checked against the model on the Explore page, which falls back to its defaults."""
    if st.session_state.get(_RESTORED):
        return
    st.session_state[_RESTORED] = True
    asked = st.query_params
    st.session_state[_ASKED] = asked.to_dict()
    if asked.get("lang") in i18n.LANGUAGES:
        st.session_state["lang"] = asked["lang"]
    if asked.get("photo") in attnviz.photos.SAMPLES:
        st.session_state["source"], st.session_state["sample"] = "sample", asked["photo"]
    elif SHARED_NAME.fullmatch(asked.get("photo", "")):  # a presenter's photo (attnviz.shared_photos), by its name
        st.session_state["source"], st.session_state["shared_photo"] = "shared", asked["photo"]
    layer = asked.get("layer", "")
    if layer.isdecimal() and 1 <= int(layer) <= 999:
        st.session_state["layer"] = st.session_state[LESSON_LAYER] = int(layer)
    head = asked.get("head", "")
    if head in HEAD_FUSIONS or (head.isdecimal() and 1 <= int(head) <= 999):
        st.session_state["head"] = head if head in HEAD_FUSIONS else int(head)
        if head.isdecimal():  # the lesson's Head box counts from 0 and has no mean, max or min
            st.session_state[memory_of(LESSON_HEAD)] = int(head) - 1
    if asked.get(BEGINNER) == "1":
        st.session_state[BEGINNER] = True
    step = asked.get("step", "")
    if step.isdecimal() and 1 <= int(step) <= 99:  # the lesson checks it against its steps
        st.session_state[memory_of(LESSON_STEP)] = int(step) - 1
    model = asked.get("model", "")
    if 0 < len(model) <= 300:  # the Model box keeps it only where the server offers it
        st.session_state["model_choice"] = model
    size = asked.get("size", "")
    if size == "native" or (size.isdecimal() and 1 <= int(size) <= 9999):  # the Size box checks it against the model
        st.session_state["size"] = NATIVE if size == "native" else int(size)
    if "view" in asked or "query" in asked or set(asked) - {*LINKED, PRESENT}:
        from . import views  # the registry imports every view: only when a link names one, or a control
        from .views.query import follow_link

        if asked.get("view") in views.registered():
            st.session_state["view"] = asked["view"]
        follow_link(asked.get("query", ""))
        for spec in (*DISPLAY, *(spec for view in views.registered().values() for spec in view.linked)):
            if spec.name in asked and (value := spec.read(asked[spec.name])) is not None:
                st.session_state[spec.key] = value  # the view checks it against the model (Linked.prepare)


def asked(name: str) -> str | None:
    """What the address the session opened on asks of ``name``, once: None after the first call, so that a
    later run keeps the page's own choice (the dataset page checks a run's name against the runs it lists)."""
    return st.session_state.get(_ASKED, {}).pop(name, None)


def asked_number(name: str) -> int | None:
    """:func:`asked`, where a link's value is a count from 1 (a layer, a head)."""
    words = asked(name) or ""
    return int(words) if words.isdecimal() and 1 <= int(words) <= 999 else None


def choices(photo: str | None, lang: str, view: str | None = None, layer: int | None = None,
            head: str | int | None = None, query: str | None = None, step: int | None = None,
            model: str | None = None, size: str | None = None, run: str | None = None, ranking: str | None = None,
            controls: dict[str, str] | None = None, beginner: bool = False) -> dict[str, str]:
    """The address's values for what is shown: ``photo`` a sample's name (None for anything else), the view,
    layer, head, query token and lesson step where the page shows them (the Swin page has none of its own: None),
    the model and size where they are not the page's first (``Settings.linked``), the dataset page's run and
    ranking, the view's ``controls`` (:func:`controls`) after the query, and ``beginner=1`` in beginner mode."""
    said = {"view": view, "layer": layer, "head": head, "query": query, "step": step, "photo": photo, "model": model,
            "size": size, "run": run, "ranking": ranking, BEGINNER: 1 if beginner else None, "lang": lang,
            **(controls or {})}
    order = (*LINKED[:4], *(controls or {}), *LINKED[4:])  # the view's controls after its query
    return {name: str(said[name]) for name in order if said[name] is not None}


def controls(state, ctx: Context | None, used: frozenset[str], linked: tuple[Linked, ...] = ()) -> dict[str, str]:
    """The address's words for the display controls a view reads (``used``) and for its own controls (``linked``),
    where they differ from what it opens on for ``ctx``'s model and capture."""
    specs = [*(spec for spec in DISPLAY if spec.key in used), *linked]
    return {spec.name: words for spec in specs if (words := spec.words(state, ctx)) is not None}


def publish(linked: dict[str, str]) -> None:
    """Write ``linked`` (from :func:`choices`) into the address, in its order; every other parameter goes, but
    ``present``. The address is rewritten only when it says something else (a link's own order included)."""
    st.session_state.pop(_ASKED, None)  # the link is spent: another page opened later starts on its own choices
    params = st.query_params
    wanted = {**linked, **({PRESENT: params[PRESENT]} if PRESENT in params else {})}
    if list(params.to_dict().items()) != list(wanted.items()):
        params.from_dict(wanted)


def link(base: str, linked: dict[str, str]) -> str:
    """``base`` (a server's address, or a page's: ``http://host/lesson``) opening on ``linked``."""
    if not linked:
        return base
    return f"{base.rstrip('/')}{'' if urlsplit(base).path.strip('/') else '/'}?{urlencode(linked)}"
