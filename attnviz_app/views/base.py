"""What a view is: a function that draws one way of looking at a capture, and the controls it reads.

A view module ends with ``register(View("name", show, controls=..., needs=...))``; its label is the locale key
``views.<name>``, and ``needs`` says in one sentence what a model lacks where the view cannot draw it (the page
shows that sentence instead; every view draws on every model whose capture has what it needs). The registry (:func:`attnviz_app.views.registered`) finds every module of this
package, so adding a view is one new file plus its labels. A view that declares no controls gets none:
the page hides Layer and Head and disables the display controls there ("every control on screen does
something").
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any
from dataclasses import dataclass

from PIL import Image

from attnviz import Capture, Model, render
from attnviz.capture import Head

# The page's shared controls a view may read.
LAYER, HEAD, OPACITY, COLOURS, SMOOTH = "layer", "head", "alpha", "cmap", "smooth"
ALL = frozenset({LAYER, HEAD, OPACITY, COLOURS, SMOOTH})


@dataclass(frozen=True, eq=False)
class Context:
    model: Model
    cap: Capture
    view: Image.Image  # the S × S picture the model saw
    layer: int  # 0-based
    head: Head  # 0-based index or "mean" / "max" / "min"
    alpha: float
    cmap: str
    smooth: bool
    fit: str
    cap_key: tuple = ()  # the capture's cache key (model, photo, fit): shared heavy jobs are keyed by it
    present: bool = False  # presenter view: the picture large, side panels left out
    narrow: bool = False  # a phone: clickable charts drawn to fit a 358 px column
    # The capture and the view got back when a download is clicked (attnviz_app.ui.Recall); None (tests, a
    # notebook): held as they are.
    recall: Any = None
    panel: Any = None  # the presenter view's side column: where a view with its own boxes (Stage, Block) puts them
    beginner: bool = False  # beginner mode: the facts in one line, the research tools one toggle away

    def later(self) -> tuple[Callable[[], Capture], Callable[[], Image.Image]]:
        """Functions that give the capture and the view when called — after the run, e.g. as a download is
        built — without holding them (a session keeps its downloads' functions until its tab closes)."""
        if self.recall is not None:
            return self.recall.capture, self.recall.view
        cap, view = self.cap, self.view
        return (lambda: cap), (lambda: view)

    def deferred(self, draw: Callable[..., Any], *args) -> Callable[[], Any]:
        """``draw(capture, view, *args)`` as a function called later (a download's picture, drawn when clicked):
        what it holds is ``args`` and the means to get the capture back, not the picture."""
        capture, view = self.later()
        return lambda: draw(capture(), view(), *args)


def _always(value: Any, ctx: Context) -> bool:
    return True


def _draws_any(ctx: Context) -> str | None:
    return None


@dataclass(frozen=True)
class Linked:
    """One of a view's own controls as a link names it (``/?view=rollout&fusion=max``, attnviz_app/links.py): the
    widget's session-state ``key`` is written as ``name`` in the address where its value is not the one the view
    opens on."""

    name: str  # in the address; unique across the page
    key: str  # the widget's session-state key
    read: Callable[[str], Any]  # the address's words → the widget's value; None where the page never offers it
    first: Callable[[Context], Any]  # the value the view opens on, for this model and capture
    write: Callable[[Any], str] = str
    fits: Callable[[Any, Context], bool] = _always  # whether this model and capture offer the value

    def prepare(self, state: MutableMapping, ctx: Context) -> None:
        """Before the widget is drawn: a value this capture does not offer (a link's layer range past the model's
        last layer) is dropped, and the widget opens on its first value. Its value comes only from session state
        then: a widget given a value of its own as well makes Streamlit warn."""
        if self.key in state and not self.fits(state[self.key], ctx):
            del state[self.key]
        state.setdefault(self.key, self.first(ctx))

    def words(self, state: Mapping, ctx: Context) -> str | None:
        """The address's words for the widget's value; None where it is the one the view opens on."""
        value = state.get(self.key)
        return None if value is None or value == self.first(ctx) else self.write(value)


def patch_named(name: str) -> tuple[int, int] | None:
    """A link's ``r3c11`` as (row, column), 0-based; None for anything else."""
    found = re.fullmatch(r"r([1-9][0-9]{0,2})c([1-9][0-9]{0,2})", name)
    return (int(found[1]) - 1, int(found[2]) - 1) if found else None


def one_of(options: Sequence) -> Callable[[str], Any]:
    """Read a link's word as one of ``options`` (strings)."""
    return lambda words: words if words in options else None


def number(low: float, high: float, step: float) -> Callable[[str], float | None]:
    """Read a link's number as a slider from ``low`` to ``high`` in ``step``s has it (an int where the step is)."""
    def read(words: str) -> float | None:
        try:
            value = float(words)
        except ValueError:
            return None
        if not low <= value <= high:
            return None
        value = low + round((value - low) / step) * step  # on the slider's steps, as it would show it
        return int(round(value)) if isinstance(step, int) else round(value, 6)
    return read


def flag(words: str) -> bool | None:
    """Read a link's ``1`` or ``0`` (a toggle)."""
    return {"1": True, "0": False}.get(words)


def write_flag(value: bool) -> str:
    return "1" if value else "0"


def write_number(value: float) -> str:
    return f"{value:g}"  # a slider's 0.6500000000000001 as 0.65


# The sidebar's display controls, as a link names them where the view shown reads them (attnviz_app/links.py)
DISPLAY = (
    Linked("opacity", OPACITY, number(0.0, 1.0, 0.05), lambda ctx: 0.6, write_number),
    Linked("cmap", COLOURS, one_of(render.COLORMAPS), lambda ctx: render.COLORMAPS[0]),
    Linked("smooth", SMOOTH, flag, lambda ctx: False, write_flag),
)


@dataclass(frozen=True)
class View:
    """One entry of the page's view selector."""

    name: str  # its label is the locale key ``views.<name>``
    show: Callable[[Context], None]
    controls: frozenset[str] = frozenset()  # the shared controls it reads
    order: int = 100  # place in the selector
    needs_classifier: bool = False  # says "classifier only" next to its label on a backbone
    # The controls it reads given the session's own choices inside the view (e.g. one mask per head).
    controls_in: Callable[[Mapping, frozenset[str]], frozenset[str]] | None = None
    reads_query: bool = False  # draws the session's query token (views.query): a link to it names the query
    linked: tuple[Linked, ...] = ()  # its own controls that a link names
    # the locale key of the sentence saying why the page's Layer and Head are hidden, where it reads neither
    no_layer_head: str = "classroom.no_layer_head"
    # What it needs of the model and the chosen layer (a class token, one token set across layers, a classifier, …):
    # one sentence in the page's language naming what this model has where the view cannot draw it, else None.
    needs: Callable[[Context], str | None] = _draws_any
    beginner: bool = False  # one of the few views beginner mode offers (a first lesson: the map, a query, the heads)

    def used(self, state: Mapping) -> frozenset[str]:
        return self.controls if self.controls_in is None else self.controls_in(state, self.controls)

    def refusal(self, ctx: Context) -> str | None:
        """Why this view cannot draw ``ctx`` (one sentence), or None: the page shows the sentence instead."""
        return self.needs(ctx)


_REGISTERED: dict[str, View] = {}  # filled once, as view modules are imported; never changed by a run


def register(view: View) -> View:
    """Add ``view`` to the page's selector (a view module calls this once, at import)."""
    if _REGISTERED.get(view.name, view) is not view:
        raise ValueError(f"two views are called {view.name!r}")
    taken = {spec.name for spec in DISPLAY} | {
        spec.name for other in _REGISTERED.values() if other is not view for spec in other.linked}
    if clash := taken & {spec.name for spec in view.linked}:
        raise ValueError(f"two views link a control as {sorted(clash)}")
    _REGISTERED[view.name] = view
    return view


def registered() -> dict[str, View]:
    """Every registered view, in selector order."""
    return dict(sorted(_REGISTERED.items(), key=lambda item: (item[1].order, item[0])))
