"""The server's tuning travels with the app: whatever starts it, the process runs the same way."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import APP, ROOT

FIRST_RUN = f"""
import json, threading, torch
from streamlit.testing.v1 import AppTest
before = torch.get_num_threads()
app = AppTest.from_file({str(APP)!r}, default_timeout=180).run()
assert not app.exception, app.exception
after = []  # as a later session's script thread sees it (PyTorch applies its setting to each new thread)
later = threading.Thread(target=lambda: after.append(torch.get_num_threads()))
later.start(); later.join()
print(json.dumps(dict(before=before, after=after[0],
                      housekeeping=any(t.name == "attnviz-housekeeping" for t in threading.enumerate()))))
"""


def python(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "ATTNVIZ_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], env={**environ, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_plain_streamlit_run_gets_the_servers_tuning_on_its_first_page_run():
    """The router's first run (what `streamlit run app.py` does) sets one thread per forward pass and starts
    the housekeeping thread, as `attnviz app` does before its server starts."""
    run = json.loads(python(FIRST_RUN, OMP_NUM_THREADS="2"))
    assert run == {"before": 2, "after": 1, "housekeeping": True}
    run = json.loads(python(FIRST_RUN, OMP_NUM_THREADS="2", ATTNVIZ_THREADS="2"))
    assert run["after"] == 2


HOUSEKEEPING = """
import gc, json, time, weakref
from attnviz_app import tuning

class Node: pass

gc.disable()  # no automatic collections: only the housekeeping thread's, or none
if {start}:
    tuning.housekeeping(None, first_after_s=0.05, every_s=0.05)
time.sleep(0.2)  # after the freeze
cycle = Node(); cycle.me = cycle; gone = weakref.ref(cycle); del cycle
time.sleep(0.5)
print(json.dumps(gone() is None))
"""


@pytest.mark.serial  # its collections come every 50 ms within 0.7 s: timed, so it runs alone (make test's serial pass)
def test_the_housekeeping_thread_collects_what_streamlits_skipped_collection_would_have():
    """Streamlit's full collection after every page run is off (``runner.postScriptGC``); the housekeeping thread
    collects instead, so a session's unreachable cycles (a capture held by a widget's closure) still go."""
    import tomllib

    config = tomllib.loads((ROOT / "attnviz_app" / "config.toml").read_text())
    assert config["runner"]["postScriptGC"] is False
    assert json.loads(python(HOUSEKEEPING.format(start=True))) is True
    assert json.loads(python(HOUSEKEEPING.format(start=False))) is False  # the control: nothing else collects
