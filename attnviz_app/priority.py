"""Who goes first on a shared server: a visitor's photo before the live camera's frames.

One :class:`attnviz.live_sharing.Priority` per server process: the page decodes and captures a photo in
its ``foreground()`` (``attnviz_app/ui.py``), which takes a core from the live frames, and every live stream
computes its frames in its ``background()`` (``attnviz_app/live.py``): one frame at a time per two cores while
several streams run (a photo uploaded beside them waits least), one per core while a single stream runs (a
forward pass on a runtime releases Python's GIL: one viewer got 15–18 heatmaps/s against 12–13;
docs/live-camera.md).
"""
from __future__ import annotations

import streamlit as st

from attnviz.jobs import core_count
from attnviz.live_sharing import Priority


@st.cache_resource(show_spinner=False)
def priority() -> Priority:
    """The server's one Priority, shared by every browser session."""
    return Priority.server(core_count())
