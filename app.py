"""attnviz from a checkout: `streamlit run app.py` serves the installed app (`pip install -e .[app]`, or `make run`)."""
from attnviz_app.router import main

main()
