"""Who goes first on a shared server: a visitor's photo before the live camera's frames.

One :class:`attnviz.live.Foreground` per server process: the page decodes and captures a photo inside
it (``attnviz_app/ui.py``), and every live stream starts no new frame while any photo is being worked on
(``attnviz_app/live.py``). The streams' threads also run at the lowest OS priority.
"""
from __future__ import annotations

import streamlit as st

from attnviz.live import Foreground


@st.cache_resource(show_spinner=False)
def foreground() -> Foreground:
    """The server's one Foreground, shared by every browser session."""
    return Foreground()
