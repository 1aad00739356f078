"""The page's words in the language this browser session chose."""
from __future__ import annotations

import streamlit as st

from attnviz import i18n


def t(key: str, **values: object) -> str:
    """Translate ``key`` into the language this browser session chose."""
    return i18n.text(st.session_state.get("lang") or i18n.DEFAULT, key, **values)
