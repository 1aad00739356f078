"""Who goes first on a shared server: a visitor's photo before the live camera's frames.

One :class:`attnviz.live_sharing.Priority` per server process: the page decodes and captures a photo in
its ``foreground()`` (``attnviz_app/ui.py``), and every live stream computes its frames in its
``background()`` (``attnviz_app/live.py``), as many frames at once as cores: a forward pass on a runtime
releases Python's GIL for its whole length, so two frames on two cores take little more time than one
(one viewer: 15–18 heatmaps/s against 12–13 one frame at a time; docs/live-camera.md).
"""
from __future__ import annotations

import streamlit as st

from attnviz.jobs import core_count
from attnviz.live_sharing import Priority


@st.cache_resource(show_spinner=False)
def priority() -> Priority:
    """The server's one Priority, shared by every browser session."""
    return Priority(background=core_count())  # turns, server-wide
