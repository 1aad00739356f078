"""Take it with you: the interactive page and the layer sweep as downloads, built only when clicked."""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from attnviz import html, i18n, sweep
from ..text import t

from .base import Context
from .common import download_file, head_label, head_part


def downloads(ctx: Context) -> None:
    """Two download buttons: the self-contained HTML page (in the page's language) and the GIF sweep."""
    files(ctx.model, ctx.cap, ctx.head, ctx.alpha, ctx.cmap, ctx.later())


def files(model, cap, head, alpha: float, cmap: str, later: tuple[Callable, Callable]) -> None:
    """:func:`downloads` for any capture (the Stage view's too: each layer at its own grid). ``later``: functions
    that give the capture and the model's view when a button is clicked (:meth:`Context.later`) — the buttons
    outlive the run, and must not hold the capture."""
    lang = st.session_state.get("lang") or i18n.DEFAULT
    capture, view = later

    def page() -> bytes:
        cap = capture()
        return html.page(cap, lang, top=model.top_classes(cap.output), picture=view()).encode("utf-8")

    def gif() -> bytes:
        return sweep.sweep_gif(capture(), head=head, alpha=alpha, cmap=cmap, picture=view())

    download_file(page, f"attention_{model.size}px.html", key="download_html", mime="text/html",
                  label=t("takeaway.download_html"), help=t("takeaway.download_html_help", mb=html.estimated_mb(cap)))
    download_file(gif, f"attention_layers_head{head_part(head)}.gif", key="download_gif", mime="image/gif",
                  label=t("takeaway.download_gif"),
                  help=t("takeaway.download_gif_help", layers=cap.num_layers, head=head_label(head)))
