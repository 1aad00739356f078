"""The page's views. Each is ``show(ctx)``: it draws one way of looking at a capture.

Only the chosen view runs, so views that are not open cost nothing; none of them runs the model.
To add a view: write ``views/<name>.py`` with ``show(ctx: Context) -> None``, add it to ``VIEWS``
and give it a label ``views.<name>`` in every catalogue.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from PIL import Image

from attnviz import Capture, Model
from attnviz.capture import Head


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


from . import cls, heads, mask, matrix, norms, query, relevance, rollout, stats  # noqa: E402  (views import Context from here)

# Which of the page's shared controls each view reads; the page hides or disables the others there
# ("every control on screen does something"). Rollout and class-specific maps have their own layer range
# and head fusion; head statistics show every layer and head at once; mass masks draw no colours.
LAYER, HEAD, OPACITY, COLOURS, SMOOTH = "layer", "head", "alpha", "cmap", "smooth"
ALL = frozenset({LAYER, HEAD, OPACITY, COLOURS, SMOOTH})
CONTROLS: dict[str, frozenset[str]] = {
    "cls": ALL,
    "query": ALL,
    "matrix": frozenset({LAYER, HEAD, COLOURS}),
    "heads": ALL,
    "rollout": frozenset({OPACITY, COLOURS, SMOOTH}),
    "mask": frozenset({LAYER, HEAD}),
    "stats": frozenset(),
    "relevance": frozenset({OPACITY, COLOURS, SMOOTH}),
    "norms": frozenset({LAYER, OPACITY, COLOURS, SMOOTH}),  # token norms are per layer, not per head
}


def controls(view: str, state) -> frozenset[str]:
    """The shared controls ``view`` reads, given the session's own choices inside the view."""
    used = CONTROLS.get(view, ALL)
    if view == "mask" and state.get("mask_source") == "heads":  # one mask per head: Head is not read
        used = used - {HEAD}
    return used


VIEWS: dict[str, Callable[[Context], None]] = {
    "cls": cls.show,
    "query": query.show,
    "matrix": matrix.show,
    "heads": heads.show,
    "rollout": rollout.show,
    "mask": mask.show,
    "stats": stats.show,
    "relevance": relevance.show,
    "norms": norms.show,
}
