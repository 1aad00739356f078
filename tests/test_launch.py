"""``make run``'s warm start fills the very cache entries the first visitor's page run reads."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

import attnviz
from conftest import APP


def test_warm_start_fills_the_pages_own_caches(monkeypatch):
    from attnviz_app import launch, ui

    ui.cached_model.clear()
    ui.cached_capture.clear()
    launch.warm()

    def no_model_run(*args, **kwargs):
        raise AssertionError("the page ran the model although launch.warm() had captured this photo")

    # After the warm start the first visitor's run (sidebar defaults, first sample) must neither load a
    # model nor capture: both come from the entries warm() made.
    monkeypatch.setattr(attnviz, "load_model", no_model_run)
    monkeypatch.setattr(attnviz, "capture", no_model_run)
    app = AppTest.from_file(str(APP), default_timeout=120).run()
    assert not app.exception, app.exception
    assert app.slider(key="layer").value == 12 and app.get("image")
