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


from . import cls, heads, mask, matrix, norms, query, relevance, rollout, stats  # noqa: E402  (views import Context from here)

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
