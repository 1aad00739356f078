"""Small Streamlit pieces several views share."""
from __future__ import annotations

import io

import numpy as np
import streamlit as st
from PIL import Image

from attnviz import render
from ui import t

DISPLAY_PX = 448  # small inputs are shown at least this large, each model pixel a crisp block


def enlarge(picture: Image.Image) -> Image.Image:
    scale = max(1, -(-DISPLAY_PX // picture.width))
    return picture.resize((picture.width * scale, picture.height * scale), resample=Image.Resampling.NEAREST)


def head_label(head) -> str:
    return t(f"view.head_{head}") if isinstance(head, str) else t("view.head_n", n=head + 1)


def heatmap(picture: Image.Image, grid_map: np.ndarray, cmap: str, caption: str) -> None:
    """Show an overlay with its colour bar and the numbers at both ends of the scale."""
    st.image(picture, caption=caption)
    st.image(render.colorbar(cmap, width=picture.width, height=14))
    st.caption(t("view.scale", lo=float(grid_map.min()), hi=float(grid_map.max())))


def download_png(picture: Image.Image, file_name: str, key: str) -> None:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    st.download_button(t("view.download"), buffer.getvalue(), file_name=file_name, mime="image/png", key=key)
