"""attnviz — what does a Vision Transformer look at?  Start with `streamlit run app.py`."""
from __future__ import annotations

import streamlit as st

import startup

st.set_page_config(page_title="attnviz", page_icon="👁", layout="wide")
with startup.importing():
    import ui
    import views
    from attnviz import render
    from attnviz.capture import HEAD_FUSIONS
    from ui import t

ui.language_picker()
settings = ui.model_settings()
st.sidebar.header(t("view.display"))
alpha = st.sidebar.slider(t("view.opacity"), 0.0, 1.0, 0.6, 0.05, key="alpha")
cmap = st.sidebar.selectbox(t("view.colormap"), render.COLORMAPS, key="cmap")
smooth = st.sidebar.toggle(t("view.smooth"), value=False, key="smooth", help=t("view.smooth_help"))

st.title(t("app.title"))
st.caption(t("app.subtitle"))

model = ui.model_or_stop(settings)
checked, cap, cap_key = ui.capture_or_stop(model, settings)

heads = [*HEAD_FUSIONS, *range(1, cap.num_heads + 1)]
if st.session_state.get("layer", 0) > cap.num_layers or st.session_state.get("head", "mean") not in heads:
    # a kept choice from a bigger model: start this one at its last layer, mean of heads
    st.session_state.pop("layer", None)
    st.session_state.pop("head", None)
layer_col, head_col, view_col = st.columns([3, 2, 2])
layer = layer_col.slider(t("view.layer"), 1, cap.num_layers, cap.num_layers, key="layer")
head = head_col.selectbox(
    t("view.head"), heads, key="head",
    format_func=lambda h: t(f"view.head_{h}") if isinstance(h, str) else str(h),
)
chosen = view_col.selectbox(t("views.choose"), list(views.VIEWS), format_func=lambda v: t(f"views.{v}"), key="view")

views.VIEWS[chosen](views.Context(
    model=model, cap=cap, view=model.view(checked.image, settings.fit), layer=layer - 1,
    head=head if isinstance(head, str) else head - 1, alpha=alpha, cmap=cmap, smooth=smooth, fit=settings.fit,
    cap_key=cap_key,
))
