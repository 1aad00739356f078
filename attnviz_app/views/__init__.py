"""The page's views. Each module here draws one way of looking at a capture and registers itself.

Only the chosen view runs, so views that are not open cost nothing; none of them runs the model.
To add a view: write ``attnviz_app/views/<name>.py`` with ``show(ctx: Context) -> None`` ending in
``register(View("<name>", show, controls=...))``, and give it a label ``views.<name>`` in every
catalogue (``attnviz/locales/*/app.toml``). Nothing else changes (docs/architecture.md).
"""
from __future__ import annotations

import importlib
import pkgutil

from .base import ALL, COLOURS, DISPLAY, HEAD, LAYER, OPACITY, SMOOTH, Context, Linked, View, register

__all__ = ["ALL", "COLOURS", "DISPLAY", "HEAD", "LAYER", "OPACITY", "SMOOTH", "Context", "Linked", "View", "register",
           "registered"]


def registered() -> dict[str, View]:
    """Every view of this package (each module imported once, so it registers) and any registered by hand."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    from .base import registered as views

    return views()
