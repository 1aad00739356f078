"""What a view is: a function that draws one way of looking at a capture, and the controls it reads.

A view module ends with ``register(View("name", show, controls=...))``; its label is the locale key
``views.<name>``. The registry (:func:`attnviz_app.views.registered`) finds every module of this
package, so adding a view is one new file plus its labels. A view that declares no controls gets none:
the page hides Layer and Head and disables the display controls there ("every control on screen does
something").
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from dataclasses import dataclass

from PIL import Image

from attnviz import Capture, Model
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

    def used(self, state: Mapping) -> frozenset[str]:
        return self.controls if self.controls_in is None else self.controls_in(state, self.controls)


_REGISTERED: dict[str, View] = {}  # filled once, as view modules are imported; never changed by a run


def register(view: View) -> View:
    """Add ``view`` to the page's selector (a view module calls this once, at import)."""
    if _REGISTERED.get(view.name, view) is not view:
        raise ValueError(f"two views are called {view.name!r}")
    _REGISTERED[view.name] = view
    return view


def registered() -> dict[str, View]:
    """Every registered view, in selector order."""
    return dict(sorted(_REGISTERED.items(), key=lambda item: (item[1].order, item[0])))
