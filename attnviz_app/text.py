"""The page's words in the language this browser session chose."""
from __future__ import annotations

import streamlit as st

from attnviz import i18n


def t(key: str, **values: object) -> str:
    """Translate ``key`` into the language this browser session chose."""
    return i18n.text(st.session_state.get("lang") or i18n.DEFAULT, key, **values)


def device_label(device: object) -> str:
    """What a student reads for a PyTorch device: "CPU", or "GPU (cuda:0)" (its name otherwise)."""
    name = str(device)
    kind = name.split(":")[0]
    return t("model.device_cuda", device=name) if kind == "cuda" else t("model.device_cpu") if kind == "cpu" else name
