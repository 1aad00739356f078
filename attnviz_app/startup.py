"""What a page shows while its first run after a server start imports torch, torchvision and timm."""
from __future__ import annotations

import streamlit as st

MESSAGE = "Starting attnviz: loading PyTorch … / 正在啟動 attnviz：載入 PyTorch …"  # no language chosen yet


def importing():
    """A spinner around a page's heavy imports: ~5 s on a 2-core machine on the server's first run, instant
    on every later one. Without it the page stays blank meanwhile."""
    return st.spinner(MESSAGE)
