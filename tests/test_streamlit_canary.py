"""The canary: every Streamlit internal the app relies on, against the Streamlit installed. Each failure names the
piece that moved, so that a new Streamlit (the ``app`` extra allows one minor: pyproject.toml) breaks here, loudly,
not silently in the page's CSS and scripts or only when a person clicks.

- the bound: the pinned Streamlit and streamlit-webrtc (requirements.txt, installed) are inside the ``app`` extra's;
- every import from ``streamlit`` and ``streamlit_webrtc`` under attnviz_app/ resolves, and the attributes the app
  reads off the private ones exist (``Runtime.exists``, ``Runtime.instance().is_active_session``, the run
  context's ``session_id``, ``StopException``, ``net_util.get_internal_ip``, ``streamlit.web.cli``'s ``run``);
- every ``data-testid`` the app's CSS and scripts select is in Streamlit's frontend, and shows on a real page
  (tests/canary_page.py, one server and one Chromium page load), as do the class names and attributes they read
  (``data-stale``, ``block-container``, ``data-test-script-state``);
- the English words attnviz_app/text.py rewrites are still Streamlit's (in its frontend's JavaScript).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
import streamlit
from packaging.requirements import Requirement

import attnviz_app
from attnviz_app import text

ROOT = Path(__file__).resolve().parents[1]
APP_DIR = Path(attnviz_app.__file__).parent
STATIC = Path(streamlit.__file__).with_name("static")


@cache
def app_sources() -> dict[str, str]:
    """attnviz_app's Python, JavaScript and CSS, by path relative to the repository."""
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(APP_DIR.rglob("*"))
            if p.suffix in (".py", ".js", ".css")}


@cache
def frontend() -> str:
    """Streamlit's frontend: every JavaScript and CSS file it serves, joined."""
    files = sorted(p for p in STATIC.rglob("*") if p.suffix in (".js", ".css"))
    assert files, f"no frontend files under {STATIC}"
    return "\n".join(p.read_text(errors="replace") for p in files)


def selected_testids() -> dict[str, list[str]]:
    """Each ``data-testid`` the app's CSS and scripts select, with the files that select it."""
    found: dict[str, list[str]] = {}
    for path, source in app_sources().items():
        for testid in set(re.findall(r"""data-testid\s*[~^$*|]?=\s*\\?["'](st[A-Za-z-]+)\\?["']""", source)):
            found.setdefault(testid, []).append(path)
    return found


# Class names and attributes of Streamlit's the app's CSS and scripts (and tests/serve.py) read, beside test ids:
# (what the app source says, what Streamlit's frontend must hold).
OTHER_HOOKS = {
    ".block-container": "`stMainBlockContainer block-container`",  # the main column's padding (classroom CSS)
    'data-stale="true"': '"data-stale":',  # a previous run's element, skipped when scrolling to the new picture
    "data-test-script-state": '"data-test-script-state":',  # the run is over (AFTER_RUN_JS; serve.settle)
    '"notRunning"': "`notRunning`",
}


# --- the bound -------------------------------------------------------------------------------------------------


def test_pins_and_installed_versions_are_inside_the_app_extras_bounds():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["app"]
    bounds = {Requirement(r).name: Requirement(r).specifier for r in extra}
    pins = dict(re.findall(r"^(streamlit(?:-webrtc)?)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M))
    import streamlit_webrtc
    from importlib.metadata import version

    for name in ("streamlit", "streamlit-webrtc"):
        assert bounds[name], f"the app extra leaves {name} unbounded"
        assert not bounds[name].contains("999"), f"the app extra's {name} {bounds[name]} has no upper bound"
        assert pins[name] in bounds[name], f"requirements.txt pins {name}=={pins[name]}, outside {bounds[name]}"
        assert version(name) == pins[name], f"{name} {version(name)} is installed, requirements.txt pins {pins[name]}"
    assert streamlit.__version__ == pins["streamlit"] and streamlit_webrtc.__name__ == "streamlit_webrtc"


# --- private imports --------------------------------------------------------------------------------------------


def streamlit_imports() -> list[tuple[str, str, str | None]]:
    """(file, module, name) of every ``import streamlit…`` / ``from streamlit… import name`` under attnviz_app."""
    found = []
    for path, source in app_sources().items():
        if not path.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                    "streamlit", "streamlit_webrtc"):
                found += [(path, node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(path, a.name, None) for a in node.names if a.name.split(".")[0] in (
                    "streamlit", "streamlit_webrtc")]
    return found


def test_every_streamlit_import_of_the_app_resolves():
    imports = streamlit_imports()
    # the private ones this canary was written for are among those it found (it parses the source right)
    assert {("streamlit.runtime", "Runtime"), ("streamlit", "net_util"), ("streamlit.web", "cli"),
            ("streamlit.runtime.scriptrunner", "get_script_run_ctx"),
            ("streamlit.runtime.scriptrunner_utils.exceptions", "StopException")} <= {(m, n) for _, m, n in imports}
    broken = []
    for path, module, name in imports:
        try:
            imported = importlib.import_module(module)
            if name is not None and not hasattr(imported, name):
                importlib.import_module(f"{module}.{name}")  # a submodule (from streamlit import net_util)
        except Exception as error:
            broken.append(f"{path}: from {module} import {name}: {error!r}")
    assert not broken, "Streamlit moved what the app imports:\n" + "\n".join(broken)


def test_the_private_pieces_the_app_uses_are_there_with_their_shapes():
    from streamlit.runtime import Runtime
    from streamlit.runtime.scriptrunner import get_script_run_ctx
    from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException, StopException
    from streamlit.runtime.scriptrunner_utils.script_run_context import ScriptRunContext
    from streamlit.web import cli

    from streamlit import net_util

    # attnviz_app/heavy.py and live.py: is this session still connected?
    assert callable(Runtime.exists) and callable(Runtime.instance), "Runtime.exists / Runtime.instance"
    assert list(inspect.signature(Runtime.is_active_session).parameters) == ["self", "session_id"], \
        "Runtime.is_active_session(session_id)"
    assert get_script_run_ctx(suppress_warning=True) is None, "get_script_run_ctx() outside a run"
    assert "session_id" in inspect.signature(ScriptRunContext).parameters, "ScriptRunContext.session_id"
    # heavy.py and video.py: the exception a stopped run raises at the next element call, caught to leave the queue
    assert issubclass(StopException, ScriptControlException), "StopException"
    # classroom.join_url: the room's address; launch.main: `streamlit run` through its click group
    assert not [p for p in inspect.signature(net_util.get_internal_ip).parameters.values()
                if p.default is inspect.Parameter.empty], "net_util.get_internal_ip()"
    assert "run" in cli.main.commands, "streamlit.web.cli.main has no `run` command"
    run_options = {option for param in cli.main.commands["run"].params for option in param.opts}
    assert "--server.port" in run_options and "--client.toolbarMode" in run_options, "streamlit run's options"
    # the public API has no session id yet (st.context), which is why heavy.py and live.py read the run context
    assert not hasattr(streamlit.context, "session_id"), (
        "st.context.session_id exists now: use it in attnviz_app/heavy.py and live.py instead of get_script_run_ctx")


# --- the page's CSS and scripts ---------------------------------------------------------------------------------


def test_the_app_selects_test_ids_and_every_one_is_in_streamlits_frontend():
    selected = selected_testids()
    assert {"stSidebar", "stFileUploader", "stVegaLiteChart", "stElementToolbarButton"} <= selected.keys()
    bundle = frontend()
    missing = {testid: paths for testid, paths in selected.items()
               if f"`{testid}`" not in bundle and f'"{testid}"' not in bundle}
    assert not missing, f"Streamlit {streamlit.__version__} no longer names these (selected by): {missing}"


@pytest.mark.parametrize("hook", OTHER_HOOKS)
def test_the_other_hooks_the_page_reads_are_streamlits(hook):
    users = [path for path, source in app_sources().items() if hook in source] or (
        ["tests/serve.py"] if hook in (ROOT / "tests" / "serve.py").read_text() else [])
    assert users, f"nothing reads {hook} any more: take it off OTHER_HOOKS"
    assert OTHER_HOOKS[hook] in frontend(), f"Streamlit {streamlit.__version__} no longer has {hook} (read by {users})"


# The pieces of each word's pattern as Streamlit's JavaScript writes them, where the pattern is not plain text:
# the number before "MB per file" and the label before " — start" are filled in by Streamlit's code.
WORD_PIECES = {
    "per_file": [" per file`"], "clear_photo": ["Clear photo"], "help_for": ["`Help for ${"],
    "range_start": [" — ${", "`start`"], "range_end": [" — ${", "`end`"],
    "uploading": ["Uploading..."], "camera_asks": ["This app would like to use your camera."],
    "camera_how": ["Learn how to allow access."],
}


@pytest.mark.parametrize("key,pattern", text.STREAMLIT_WORDS, ids=[k for k, _ in text.STREAMLIT_WORDS])
def test_the_words_the_page_rewrites_are_still_streamlits(key, pattern):
    plain = not re.search(r"[\\()?*+\[\]]", pattern)
    pieces = [pattern] if plain else WORD_PIECES.get(key)
    assert pieces, f"{key}: {pattern!r} is a pattern; say in WORD_PIECES how Streamlit writes its words"
    unescaped = re.sub(r"\\(.)", r"\1", pattern)
    for piece in pieces:
        assert piece.strip("`").split("${")[0] in unescaped, f"{key}: {piece!r} is not part of {pattern!r}"
        assert piece in frontend(), f"Streamlit {streamlit.__version__} no longer writes {piece!r} ({key}: {pattern!r})"


def test_word_pieces_name_only_words_the_page_rewrites():
    assert WORD_PIECES.keys() <= {key for key, _ in text.STREAMLIT_WORDS}


# --- one real page ----------------------------------------------------------------------------------------------

TESTIDS_JS = "() => [...new Set([...document.querySelectorAll('[data-testid]')].map(e => e.dataset.testid))]"
STATE_JS = "() => document.querySelector('[data-test-script-state]')?.dataset.testScriptState"


@pytest.mark.browser
def test_every_selected_test_id_shows_on_a_real_page():
    """tests/canary_page.py in Chromium: its first run (2 s) is seen running, then over; a hover shows a help
    tooltip and a chart's toolbar, and the sidebar's collapse button brings the button that expands it."""
    from serve import chromium, open_page, require_chromium, streamlit_server

    require_chromium()
    launcher = [sys.executable, "-m", "streamlit", "run", str(ROOT / "tests" / "canary_page.py")]
    with streamlit_server(launcher=launcher) as (url, _), chromium() as browser:
        page = open_page(browser, "desktop")
        page.goto(url)
        page.wait_for_function(f"() => ({STATE_JS})() === 'running'", timeout=60_000)
        page.wait_for_function(f"() => ({STATE_JS})() === 'notRunning'", timeout=60_000)
        page.locator("[data-testid='stTabs']").wait_for(timeout=30_000)
        seen = set(page.evaluate(TESTIDS_JS))
        page.locator("[data-testid='stTooltipIcon']").first.hover()
        page.locator("[data-testid='stTooltipContent']").wait_for(state="attached", timeout=10_000)
        seen |= set(page.evaluate(TESTIDS_JS))  # the tooltip goes with the next hover
        page.locator("[data-testid='stVegaLiteChart']").first.hover()
        page.locator("[data-testid='stElementToolbarButton']").first.wait_for(state="attached", timeout=10_000)
        seen |= set(page.evaluate(TESTIDS_JS))
        page.locator("[data-testid='stSidebar']").hover()
        page.locator("[data-testid='stSidebarCollapseButton'] button").click()
        page.locator("[data-testid='stExpandSidebarButton']").wait_for(state="attached", timeout=10_000)
        seen |= set(page.evaluate(TESTIDS_JS))
        blocks = page.evaluate("() => document.querySelectorAll('.block-container').length")
        page.close()
    missing = {testid: paths for testid, paths in selected_testids().items() if testid not in seen}
    assert not missing, f"not on a Streamlit {streamlit.__version__} page (selected by): {missing}"
    assert blocks == 1, ".block-container"
