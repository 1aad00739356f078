"""``attnviz app`` (and ``make run``): get the model ready, then start Streamlit in this same process.

A plain ``streamlit run app.py`` answers at once but imports torch, torchvision and timm and loads the
model on the first visit: the first student waited ~8 s. Here the server starts only once the imports
are done, the default model is in the page's cache and one capture has run (PyTorch sets up its kernels
on the first forward pass), so "You can now view your Streamlit app" means ready.

    attnviz app [streamlit options …]       # e.g. attnviz app --server.port 8600

The app's own Streamlit settings (``config.toml`` beside this file: upload limit, theme, no usage
statistics) are passed as options, so the page is the same from any folder; an option given on the
command line wins.
"""
from __future__ import annotations

import sys
import time
import tomllib
from pathlib import Path

from . import tuning

SCRIPT = Path(__file__).with_name("streamlit_app.py")
CONFIG = Path(__file__).with_name("config.toml")


def warm() -> None:
    """Import what the pages import, load the default model into the page's cache, capture once."""
    start = time.perf_counter()
    import attnviz
    from attnviz import serving

    from . import classroom, ui, views  # noqa: F401  (streamlit)
    from .settings import Settings

    views.registered()  # every view module (altair, pandas, matplotlib): the first page run imports none

    # The page's own caches (st.cache_resource works before the server starts, and it is the same cache):
    # the first visitor's run, with the sidebar's defaults and the page's first photo, then only reads them.
    settings = Settings(None, ui.DEFAULT_SIZES[0], None, "cpu", "crop")
    sample = ui.DEFAULT_PHOTO
    name, data = f"{sample}.jpg", attnviz.photos.sample(sample).read_bytes()
    model = ui.cached_model(*settings.key, serving.policy().runtime)  # the key the first page run asks for
    photo_digest = ui.digest(data)
    checked = ui.checked_image(photo_digest, attnviz.photos.decode_side(model), name, _data=data, _model=model)
    ui.cached_capture((*settings.key, model.size), photo_digest, settings.fit, _model=model, _image=checked)
    print(f"attnviz: model ready in {time.perf_counter() - start:.1f} s", flush=True)


def options(args: list[str]) -> list[str]:
    """``args`` after the app's own settings as ``--section.name value`` options, less those ``args`` sets."""
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    config = tomllib.loads(CONFIG.read_text(encoding="utf-8"))
    defaults = []
    for section, values in config.items():
        for name, value in values.items():
            flag = f"--{section}.{name}"
            if flag not in given:
                defaults += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return [*defaults, *args]


def main(args: list[str] | None = None) -> int:
    """Serve the app: ``args`` are Streamlit's own options (``--server.port 8600``)."""
    args = list(sys.argv[1:] if args is None else args)
    print("attnviz: loading PyTorch and the model …", flush=True)
    tuning.serve()  # the same tuning a plain `streamlit run app.py` gets on its first page run
    warm()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", str(SCRIPT), *options(args)]
    try:
        cli.main()
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
