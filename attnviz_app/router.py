"""The app's frame: the shared sidebar drawn once, then the chosen page (Streamlit's ``st.navigation``)."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from . import startup

# Not "pages/": beside the script Streamlit runs, a folder of that name turns on its legacy multipage app.
PAGES = Path(__file__).with_name("screens")


def main() -> None:
    st.set_page_config(page_title="attnviz", page_icon="👁", layout="wide")
    with startup.importing():  # torch, timm and the model's code: ~5 s on the server's first run
        from . import links, tuning, ui
        from .text import t, widget_words

        tuning.serve()  # once per process, whatever started the server (attnviz_app/tuning.py)

    links.restore()  # a link's choices (?view=…&layer=…), on the session's first run
    ui.keep_choices()
    ui.language_picker()
    widget_words()  # Streamlit's own English words in its uploader and camera, in the page's language
    page = st.navigation([
        st.Page(PAGES / "explore.py", title=t("nav.explore"), icon=":material/visibility:", default=True),
        st.Page(PAGES / "lesson.py", title=t("nav.lesson"), icon=":material/school:"),
        st.Page(PAGES / "dataset.py", title=t("dataset.nav"), icon=":material/photo_library:"),
    ])
    page.run()
