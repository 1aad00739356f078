"""The attnviz web app: Streamlit pages wired to the :mod:`attnviz` core.

    attnviz app                  # or, from a checkout: streamlit run app.py

``streamlit_app.py`` is the script Streamlit runs: a router (``st.navigation``) that draws the shared
sidebar once and runs the chosen page from ``screens/``. Everything here only lays out widgets; every
number comes from :mod:`attnviz`, which never imports Streamlit.
"""
