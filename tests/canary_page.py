"""The page tests/test_streamlit_canary.py serves: one of each Streamlit element whose parts the app's CSS and scripts
select by ``data-testid`` (attnviz_app/classroom.py, attnviz_app/text.py), drawn by plain Streamlit calls, so that
one page load shows whether the Streamlit installed still names them so. Its first run lasts ``RUN_S`` seconds: long
enough to see the app element's ``data-test-script-state`` say "running" before "notRunning"."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import streamlit as st

RUN_S = 2.0


def first() -> None:
    st.subheader("A heading")  # stHeadingWithActionElements
    st.caption("A caption")  # stCaptionContainer
    st.markdown("| a | b |\n|---|---|\n| 1 | 2 |")  # stMarkdownContainer
    st.latex(r"\mathrm{softmax}(QK^\top/\sqrt{d})")  # .stKatex
    st.html("<div>html</div>")  # stHtml
    st.selectbox("A box", ["one", "two"], help="Some help")  # stSelectbox, stWidgetLabel, a tooltip on hover
    st.radio("A radio", ["one", "two"])  # stRadio
    st.slider("A range", 0, 10, (2, 8))  # stSlider, stSliderThumbValue, stSliderTickBar
    st.file_uploader("A file")  # stFileUploader, stFileUploaderDropzone
    st.camera_input("A camera")  # stCameraInput
    st.image(np.zeros((40, 40, 3), np.uint8), caption="A picture")  # stImage, stImageContainer, stImageCaption
    st.dataframe(pd.DataFrame({"a": [1, 2]}))  # stDataFrame
    st.vega_lite_chart(pd.DataFrame({"x": [1, 2], "y": [3, 4]}),  # stVegaLiteChart, its stElementToolbar on hover
                       {"mark": "point", "encoding": {"x": {"field": "x"}, "y": {"field": "y"}}})
    st.tabs(["One", "Two"])  # stTabs, stTab
    with st.expander("An expander"):  # stExpander
        st.write("folded")
    if not st.session_state.setdefault("_ran", False):
        st.session_state["_ran"] = True
        time.sleep(RUN_S)


def second() -> None:
    st.write("The second page")


st.sidebar.write("The sidebar")  # stSidebar, stSidebarCollapseButton
st.navigation([st.Page(first, title="First"), st.Page(second, title="Second")]).run()  # stSidebarNavLink
