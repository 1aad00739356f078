"""The script Streamlit runs for `attnviz app`: the router of the app's pages."""
from attnviz_app.router import main

main()
