"""Shared fixtures: a tiny random timm ViT (fast, exact checks) and the real offline model."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

# A host with PYTHONDONTWRITEBYTECODE=1 (this one) made every pytest process rewrite every test module's asserts
# afresh (8 s of each collection), and every server and CLI run the tests start compile attnviz's own modules again
# (~1.7 s of CPU a server): the compiled modules are kept in __pycache__ folders (ignored by git) instead, by this
# process and by what it starts. Set before attnviz is imported, so its modules are kept too.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import pytest

if TYPE_CHECKING:
    import torch

    import attnviz

# An xdist worker (make test's parallel passes) shares the cores with the other workers: PyTorch's default team of one
# spinning OpenMP thread per core collapses beside them (3.2x slower beside one busy process, docs/performance.md), so
# each worker, and what it starts (CLI runs, servers, README examples), computes on one thread: the parallel pass of
# unit and AppTest tests took 4 min 44 s instead of 7 min 48 s. The serial pass keeps PyTorch's default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _scan_component_packages_once() -> None:
    """Every AppTest scans all ~280 installed distributions' metadata for Streamlit components (0.14 s, 13 % of an
    AppTest-heavy file's time); what is installed does not change while the tests run, so one scan serves them all.
    Where a later Streamlit moves the scanner, the tests are only slower."""
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:
        return
    scan = getattr(manifest_scanner, "scan_component_manifests", None)
    if scan is not None and not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.cache(scan)


def _await_app_runs_without_polling() -> None:
    """AppTest waits for each script run by waking every millisecond to look for its end, which takes the GIL from
    the run it waits for; waiting on the run's thread instead does the same wait without the wake-ups. Where a later
    Streamlit moves these pieces, AppTest's own wait stays."""
    try:
        from streamlit.testing.v1 import local_script_runner as runner_module
    except ImportError:
        return
    polling = getattr(runner_module, "require_widgets_deltas", None)
    if polling is None or getattr(polling, "__name__", "") != "require_widgets_deltas":
        return

    def require_widgets_deltas(runner, timeout: float = 3) -> None:
        thread = getattr(runner, "_script_thread", None)
        if thread is None:
            return polling(runner, timeout)
        thread.join(timeout)
        if not runner.script_stopped():
            return polling(runner, 0)  # AppTest's own end: it stops the run and raises its timeout error
        return None

    runner_module.require_widgets_deltas = require_widgets_deltas


def pytest_configure(config):
    """What a process that runs tests needs first. The process that hands a parallel pass's tests to its workers runs
    none and imports none of PyTorch, timm or Streamlit: it starts its workers 4–5 s sooner, once a pass."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    # A shell starts a background job (`make test &`, nohup) with Ctrl-C ignored, and Python then never turns it into
    # KeyboardInterrupt, in this process or the commands it starts: the Ctrl-C tests would fail for how the suite was
    # launched. A terminal's Ctrl-C is what they test.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    import torch

    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    _scan_component_packages_once()
    _await_app_runs_without_polling()


# The page's captures run where the owner says (ATTNVIZ_RUNTIME, default "auto": OpenVINO when attnviz[fast] is
# installed, as it is here). Most tests compare the page with PyTorch bit for bit, so they run it on PyTorch;
# tests/test_runtime_page.py runs the page on each runtime. Servers the tests start inherit this.
os.environ.setdefault("ATTNVIZ_RUNTIME", "pytorch")

ROOT = Path(__file__).resolve().parents[1]
# Found without importing either package (the parallel passes' controller imports neither).
ASSETS = Path(importlib.util.find_spec("attnviz").origin).with_name("assets")  # the sample photos the package ships
APP = Path(importlib.util.find_spec("attnviz_app").origin).with_name("streamlit_app.py")  # what `attnviz app` serves


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run long soak/load tests")


# The files whose tests take more than ~0.75 s each here (the real model, a full page run per test, a subprocess, a
# Ray cluster): `make test-fast` leaves them to `make test` (docs/tests.md, measured with --durations=0 on
# December 6). Every other file, a new one too, is in the fast tier.
HEAVY_FILES = frozenset({
    "test_hostile_library.py", "test_runtime_page.py", "test_generic.py", "test_cli_robust.py",
    "test_qkmap_dataset_page.py", "test_ablation.py", "test_lesson_page.py", "test_families.py", "test_models.py",
    "test_html.py", "test_zoo_volo.py", "test_faithfulness_cli.py", "test_qkmap_page.py", "test_links.py",
    "test_relevance.py", "test_figure.py", "test_hostile_dataset.py", "test_recall.py", "test_server_page.py",
    "test_export.py", "test_cli.py", "test_readme.py", "test_runtimes.py", "test_views_analysis.py", "test_qkmap.py",
    "test_qk_cli.py", "test_faithfulness.py", "test_views_charts.py", "test_video_page.py", "test_tuning.py",
    "test_dataset_ray.py", "test_stages_page.py", "test_wheel.py",
})


# The longest files here (--durations=0 of each pass, December 7), handed out first: a pass ends when its last file
# does, and a long file started late (the wheel's, last in name order, 94 s before uv) had left one worker alone at the
# end of the browser pass. One list serves both parallel passes: each sees only its own tests of a file.
LONGEST_FIRST = (
    "test_classroom_browser.py", "test_qkmap_browser.py", "test_phone_browser.py", "test_wheel.py",
    "test_browser_live.py", "test_stages_page.py", "test_video_browser.py", "test_qkmap.py", "test_views_charts.py",
    "test_qkmap_dataset_browser.py", "test_faithfulness_browser.py", "test_soak.py", "test_dataset_ray.py",
    "test_runtimes.py", "test_server_page.py", "test_qk_scatter_browser.py", "test_faithfulness.py", "test_readme.py",
    "test_browser.py", "test_lesson_page.py", "test_hostile_dataset.py", "test_app_robust.py",
    "test_hostile_models.py", "test_browser_load.py", "test_views_analysis.py", "test_zoo.py",
)

# Files that warm the same thing in their process, run one after another on one worker so that it is warmed once:
# numba compiles UMAP's fitting code in each process that first fits (11 s here; in a fresh venv its import compiles
# pynndescent for 14 s more, which two workers importing it at once each paid).
SAME_WORKER = {"test_qkmap.py": "UMAP", "test_qk_cli.py": "UMAP", "test_qkmap_page.py": "UMAP"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """make test's parallel passes (--dist loadfile): a file's tests on one worker, sharing its module's fixtures; the
    files handed out in LONGEST_FIRST's order (xdist's own put the files with the most tests first, which left the
    two-test Swin file to start at 302 s of a 347 s browser pass), and a SAME_WORKER group's files as one."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SAME_WORKER.get(Path(file).name, file)

    config.option.loadscopereorder = False  # the collection's order (pytest_collection_modifyitems) is the queue's
    return LongestFirst(config, log)


def _marked_where_make_sees_it(items) -> None:
    """make test's browser and serial passes collect only the files that hold "pytest.mark.browser" or
    "pytest.mark.serial" (Makefile: BROWSER_FILES, SERIAL_FILES): a test marked another way would be left out
    silently, so it stops the run instead."""
    source = functools.cache(lambda path: path.read_text(encoding="utf-8"))
    for item in items:
        for mark in ("browser", "serial"):
            if item.get_closest_marker(mark) and f"pytest.mark.{mark}" not in source(item.path):
                raise pytest.UsageError(f"{item.nodeid} is marked {mark} without the words pytest.mark.{mark} in its "
                                        f"file: make test's {mark} pass would not collect it")


def pytest_collection_modifyitems(config, items):
    _marked_where_make_sees_it(items)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests stay together, in order
    for item in items:
        if item.path.name in HEAVY_FILES:
            item.add_marker(pytest.mark.heavy)
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="long run: pass --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


class Overlap:
    """Wraps ``plain``: records each call's (thread name, PyTorch threads, rows of its tensor argument) and the
    most calls running at once; each call holds ``hold_s`` so that work meant to run side by side overlaps."""

    def __init__(self, plain, hold_s: float = 0.02):
        self.plain, self.hold_s = plain, hold_s
        self.calls: list[tuple[str, int, int]] = []
        self.most, self._now, self._lock = 0, 0, threading.Lock()

    def __call__(self, *args, **kwargs):
        import torch

        rows = next(len(a) for a in args if isinstance(a, torch.Tensor))
        self.calls.append((threading.current_thread().name, torch.get_num_threads(), rows))
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)
        time.sleep(self.hold_s)
        with self._lock:
            self._now -= 1
        return self.plain(*args, **kwargs)


def tiny_vit(reg_tokens: int = 0, num_classes: int = 10, fused: bool | None = None, seed: int = 0) -> attnviz.Model:
    """A 2-layer, 4-head ViT on 32 px inputs with 8 px patches: grid 4 × 4, N = 1 + reg + 16."""
    import timm
    import torch

    import attnviz

    torch.manual_seed(seed)
    network = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=num_classes,
        reg_tokens=reg_tokens, no_embed_class=reg_tokens > 0,
    )
    if fused is not None:
        for block in network.blocks:
            block.attn.fused_attn = fused
    return attnviz.wrap(network, "tiny", "random init", 32)


@pytest.fixture
def tiny():
    return tiny_vit()


@pytest.fixture(scope="session")
def real_model():
    import attnviz

    return attnviz.load_model(device="cpu")


@pytest.fixture(scope="session")
def cat():
    from PIL import Image

    return Image.open(ASSETS / "cat.jpg")


@pytest.fixture(scope="session")
def page_server():
    """The real page's server, as `make run` starts it but for its port, shared by every browser test file of this
    worker that needs nothing else of it: its first page run (the imports, the model) costs ~8 s of CPU, which each
    such file had paid again. Files that set the server's environment, or watch its first run, start their own."""
    from serve import require_chromium, streamlit_server

    require_chromium()
    with streamlit_server() as (url, _proc):
        yield url


@pytest.fixture(scope="module")
def app_in_chromium(page_server):
    """The real page's server and one headless Chromium, for the tests of one module: (url, browser)."""
    from serve import chromium

    with chromium() as browser:
        yield page_server, browser


@pytest.fixture
def own_shared_results():
    """The server's shared results (attnviz_app.heavy: one queue and cache for every session of this process), empty
    before the test and after it: a result another test left (one its stand-in computed for every setting, as
    test_server_page's does) would be handed to this test's page as its own, and this test's to the next."""
    from attnviz_app import heavy

    heavy.shared_queue.clear()
    yield
    heavy.shared_queue.clear()


@pytest.fixture(scope="session")
def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture
def connections(monkeypatch):
    """Every internet-family socket connection attempted while the fixture is active (refused)."""
    import socket

    seen: list[object] = []
    original = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            seen.append(address)
            raise ConnectionRefusedError("tests allow no network")
        return original(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    return seen


def written_since(folder: Path, since: float, skip=(".git", ".venv", "node_modules")) -> list[Path]:
    """Every entry under ``folder`` (files, links, FIFOs…) changed since ``since``, but in the ``skip`` folders: where a
    test looks for a copy of an upload."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            path = Path(dirpath) / name
            with contextlib.suppress(OSError):  # gone since it was listed
                if path.lstat().st_mtime >= since:
                    found.append(path)
    return found


def holds(path: Path, *needles: bytes) -> bool:
    """Whether ``path`` is a regular file under 50 MB that holds any of ``needles``. Not a FIFO, which another worker's
    hostile-file test can make in the shared temporary folder and whose opening waits for a writer forever (it hung
    test_safety until pytest-timeout's 600 s), nor a link; a file gone since it was listed holds nothing."""
    try:
        seen = path.lstat()
        return stat.S_ISREG(seen.st_mode) and seen.st_size < 50 * 2**20 and any(n in path.read_bytes() for n in needles)
    except FileNotFoundError:
        return False


def Q(cap: attnviz.Capture) -> torch.Tensor:
    """(L, H, N, d_k): a plain ViT capture's queries stacked as the tests index them (one window per layer)."""
    import torch

    assert cap.uniform, "Q() stacks the queries of a capture whose layers share one window of every token"
    return torch.stack(cap.query)[:, :, 0]


def K(cap: attnviz.Capture) -> torch.Tensor:
    """(L, H, N, d_k): the keys, as :func:`Q`."""
    import torch

    assert cap.uniform
    return torch.stack(cap.key)[:, :, 0]


def SCALE(cap: attnviz.Capture) -> float:
    """1 / √d_k of a plain ViT capture (every layer's)."""
    return cap.layouts[0].scale


def BIAS(cap: attnviz.Capture) -> torch.Tensor:
    """(L, H, N, N): a plain relative-position ViT's logit bias, stacked."""
    import torch

    return torch.stack([b[0] for b in cap.bias])
