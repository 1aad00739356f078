"""``python -m bench.classroom``: a class at once, and where one phone photo's time goes.

Sixty browser sessions (one headless Chromium, one server) each upload their own 12-megapixel phone
JPEG, the uploads spread over 10 s; we time upload → heatmap in every page, on the page's own clock, and
read the server's CPU time and resident memory. The class runs through both ways of starting the server
(``attnviz app``, which ``make run`` runs, and ``streamlit run app.py``), with desktop-size pages and with
phone-size pages, and with real-photo content (the sample photos, scaled to 12 MP with a phone's sensor
noise) beside synthetic gradients (``--content``). Then the stages of one upload, one by one in this
process: decoding, capture, overlay, picture encoding. And the warm start: a fresh server's first visitor.

Targets on a 2-core machine (issues #10, #23): p95 ≤ 5 s, server CPU ≤ 0.15 s per upload, server memory
≤ 1.5 GB afterwards, first heatmap ≤ 2 s after the server says it is ready.
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import attnviz
from tests.serve import ATTNVIZ_APP
from bench import machine

ASSETS = Path(attnviz.__file__).with_name("assets")  # the sample photos the package ships
HEATMAP = ".st-key-result [data-testid='stImage'] img"
LAUNCHER = ATTNVIZ_APP  # what `make run` runs
# Kept in each page: the moment its first heatmap picture has arrived and is drawn (one clock: the browser's).
WATCH = """() => { window.__heatAt = null; const timer = setInterval(() => {
  const i = document.querySelector(".st-key-result [data-testid='stImage'] img");
  if (i && i.complete && i.naturalWidth > 0) { window.__heatAt = Date.now(); clearInterval(timer); } }, 20); }"""


def phone_jpeg(seed: int, size: tuple[int, int] = (4032, 3024)) -> bytes:
    """A 12-megapixel, photo-like JPEG as a phone saves it, a different scene for every seed: the photo
    helper's gradients turned one of 8 ways and a dark disc somewhere on a 6 × 5 grid."""
    from PIL import Image, ImageDraw

    from tests.make_corpus import encode, photo

    w, h = size
    picture = photo(*size, seed=seed).transpose(list(Image.Transpose)[seed % 7]).resize(size)
    col, row = seed % 6, (seed // 6) % 5
    cx, cy, r = (col + 0.5) * w / 6, (row + 0.5) * h / 5, h / 7
    ImageDraw.Draw(picture).ellipse((cx - r, cy - r, cx + r, cy + r), fill=(20, 30, 60))
    return encode(picture, "JPEG", quality=90)


def real_jpeg(seed: int, size: tuple[int, int] = (4032, 3024)) -> bytes:
    """A 12-megapixel JPEG of real content as a phone saves it: one of the sample photos (cat, coffee, rocket,
    astronaut), cropped and turned a different way for every seed, scaled to 12 MP, with a sensor's grain
    (±1 level): 0.7–1.0 MB at quality 90, as the real photos issue #23 measured with (~0.85 MB)."""
    import numpy as np
    from PIL import Image

    from tests.make_corpus import encode

    names = sorted(p for p in ASSETS.glob("*.jpg"))
    rng = np.random.default_rng(seed)
    with Image.open(names[seed % len(names)]) as f:
        photo = f.convert("RGB")
    w, h = photo.size
    left, top = rng.integers(0, w // 6 + 1), rng.integers(0, h // 6 + 1)
    photo = photo.crop((left, top, left + w * 5 // 6, top + h * 5 // 6))
    photo = photo.transpose(list(Image.Transpose)[seed % 2]).resize(size, Image.Resampling.BICUBIC)
    grain = rng.integers(-1, 2, size=(size[1], size[0], 1), dtype=np.int16)
    pixels = np.clip(np.asarray(photo, dtype=np.int16) + grain, 0, 255).astype(np.uint8)
    return encode(Image.fromarray(pixels), "JPEG", quality=90)


PAGES = {"desktop": dict(viewport={"width": 1440, "height": 900}),
         "phone": dict(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)}


SETTLE_S = 12.0  # a little over attnviz_app.tuning's housekeeping period (a full collection, malloc_trim)


@dataclass(frozen=True)
class ClassRun:
    waits: tuple[float, ...]  # upload → heatmap, seconds, one per session
    cpu_per_upload: float  # server CPU seconds (user + system) per upload
    # cpu_per_upload split by thread: (threads that ended during the class: the page runs, Streamlit's script
    # threads; the main thread: the event loop, which receives the uploads and sends the pages' messages and
    # pictures; every other thread alive at the end: pollers, thread pools, housekeeping)
    cpu_split: tuple[float, float, float]
    rss_after: float  # server resident memory after all heatmaps, bytes
    rss_settled: float  # the same SETTLE_S later: after the server's housekeeping has collected and trimmed once
    pages: tuple  # the Playwright pages, for checks while the browser is still open

    @property
    def median(self) -> float:
        return statistics.median(self.waits)

    @property
    def p95(self) -> float:
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def run_class(browser, url: str, server_pid: int, photos: list[bytes], spread_s: float = 10.0,
              page_size: str = "desktop") -> ClassRun:
    """Open one page of ``page_size`` (a key of PAGES) per photo on the upload input, then upload them
    ``spread_s`` seconds apart in all."""
    import psutil

    server = psutil.Process(server_pid)
    pages = []
    for _ in photos:
        context = browser.new_context(**PAGES[page_size])
        page = context.new_page()
        page.goto(url)
        page.get_by_text("Upload a photo", exact=True).click(timeout=180_000)
        page.locator("input[type=file]").wait_for(state="attached", timeout=120_000)
        pages.append(page)
    for page in pages:  # every page idle before the clock starts
        page.wait_for_selector("[data-testid='stStatusWidget']", state="detached", timeout=60_000)
    cpu = server.cpu_times()
    threads = thread_cpu(server)
    started = []
    t0 = time.monotonic()
    for i, (page, data) in enumerate(zip(pages, photos)):
        time.sleep(max(0.0, t0 + i * spread_s / len(photos) - time.monotonic()))
        page.evaluate(WATCH)
        started.append(page.evaluate("Date.now()"))
        page.locator("input[type=file]").set_input_files(
            files=[{"name": f"IMG_{i:04d}.jpg", "mimeType": "image/jpeg", "buffer": data}])
    waits = []
    for page, start in zip(pages, started):
        page.wait_for_function("() => window.__heatAt !== null", timeout=300_000, polling=100)
        waits.append((page.evaluate("window.__heatAt") - start) / 1000)
    for page in pages:
        page.wait_for_selector("[data-testid='stStatusWidget']", state="detached", timeout=120_000)
    used = server.cpu_times()
    rss_after = server.memory_info().rss
    # Alive at the end: the main thread, pools (some grown during the class), pollers. The script threads of
    # the page runs have ended by now (every page is idle), so what they used is the rest.
    lasting = {tid: seconds - threads.get(tid, 0.0) for tid, seconds in thread_cpu(server).items()}
    cpu_s = (used.user + used.system) - (cpu.user + cpu.system)
    main = lasting.pop(server_pid, 0.0)
    others = sum(lasting.values())
    split = (cpu_s - main - others, main, others)
    n = len(photos)
    time.sleep(SETTLE_S)
    return ClassRun(tuple(waits), cpu_s / n, tuple(x / n for x in split), rss_after, server.memory_info().rss,
                    tuple(pages))


def thread_cpu(process) -> dict[int, float]:
    """CPU seconds (user + system) of each of ``process``'s threads now, by thread id (the main thread's is the
    process id)."""
    return {t.id: t.user_time + t.system_time for t in process.threads()}


def stages(repeats: int = 7) -> dict[str, float]:
    """Median seconds of each step one 12-megapixel upload costs the server, measured alone."""
    import numpy as np

    import attnviz
    from attnviz import render
    from attnviz.images import open_image
    from attnviz_app.views.common import enlarge, png_bytes

    import torch

    from attnviz_app import tuning

    torch.set_num_threads(tuning.threads())  # one intra-op thread, as the server runs
    from attnviz import runtimes, serving

    # The model as the server has it: on the owner's runtime (ATTNVIZ_RUNTIME, auto by default) where exact.
    model = runtimes.on_runtime(attnviz.load_model(device="cpu"), serving.policy().runtime, threads=tuning.threads())
    engine = runtimes.RUNTIMES[model.runtime.name].LABEL if model.runtime is not None else "PyTorch"
    data = real_jpeg(1)
    times: dict[str, list[float]] = {}

    def timed(name, fn):
        start = time.perf_counter()
        value = fn()
        times.setdefault(name, []).append(time.perf_counter() - start)
        return value

    for _ in range(repeats):
        import hashlib

        timed("sha256 of the upload", lambda: hashlib.sha256(data).hexdigest())
        timed("decode at ≤ 2048 px (the page before)", lambda: open_image(data, max_side=2048))
        checked = timed("decode for the model (read_photo)", lambda: attnviz.read_photo(data, model))
        view = timed("model view (resize + crop)", lambda: model.view(checked.image))
        cap = timed(f"capture (forward pass, {engine})", lambda: attnviz.capture_tensor(model, model.to_input(view)))
        grid = cap.cls_map(cap.num_layers - 1, "mean")
        picture = timed("overlay + enlarge", lambda: enlarge(render.overlay(view, np.asarray(grid))))
        timed("PNG encoding (588 px)", lambda: png_bytes(picture))

        def jpeg():
            buffer = io.BytesIO()
            picture.save(buffer, format="JPEG", quality=90)
            return buffer.getvalue()

        timed("JPEG encoding (588 px)", jpeg)
    return {name: statistics.median(ts) for name, ts in times.items()}


def first_visit() -> tuple[float, float]:
    """(seconds until a `make run` server answers, seconds from then to the first visitor's heatmap)."""
    from tests.serve import chromium, streamlit_server

    with chromium() as browser:
        browser.new_page().goto("about:blank")  # the browser itself is not what we time
        launched = time.perf_counter()
        with streamlit_server(launcher=LAUNCHER, timeout=300) as (url, _):
            ready = time.perf_counter()
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(url)
            page.wait_for_function(
                "s => { const i = document.querySelector(s); return i && i.complete && i.naturalWidth > 0; }",
                arg=HEATMAP, timeout=120_000)
            return ready - launched, time.perf_counter() - ready


def main() -> None:
    from tests.serve import chromium, chromium_path, streamlit_server

    parser = argparse.ArgumentParser(prog="python -m bench.classroom")
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--spread", type=float, default=10.0, help="seconds over which the uploads start")
    parser.add_argument("--pages", default="desktop,phone", help="page sizes, comma-separated: desktop, phone")
    parser.add_argument("--content", choices=("real", "synthetic"), default="real",
                        help="real: the sample photos at 12 MP with grain; synthetic: gradients and a disc")
    parser.add_argument("--ways", default="attnviz app,streamlit run app.py",
                        help="ways of starting the server, comma-separated")
    parser.add_argument("--profile", metavar="FOLDER",
                        help="record each class run's server with py-spy into FOLDER (speedscope JSON)")
    parser.add_argument("--no-browser", action="store_true", help="only the per-stage timings")
    args = parser.parse_args()
    import psutil
    import torch

    print(f"attnviz classroom benchmark — torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{psutil.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in psutil.getloadavg())}")
    print(f"machine: {machine.describe()}\n")
    print("One 12-megapixel phone JPEG (4032 × 3024), each stage alone, one thread as the server runs, medians:\n")
    print("| stage | time |")
    print("|---|---|")
    for name, seconds in stages().items():
        print(f"| {name} | {seconds * 1000:.0f} ms |")
    if args.no_browser or chromium_path() is None:
        return

    up, first = first_visit()
    print(f"\nWarm start (`make run`): the server answers after {up:.1f} s (imports, model, one capture); "
          f"the first visitor's heatmap {first:.2f} s after that (target ≤ 2 s)")

    make = real_jpeg if args.content == "real" else phone_jpeg
    photos = [make(seed) for seed in range(args.sessions)]
    launchers = {"attnviz app": LAUNCHER, "streamlit run app.py": None}
    runs = {}
    for way in args.ways.split(","):
        for size in args.pages.split(","):
            with streamlit_server(launcher=launchers[way], timeout=300) as (url, proc), chromium() as browser:
                warm = browser.new_page()  # the first visit (the warm start's or the imports) is not the class's
                warm.goto(url)
                warm.wait_for_function("s => document.querySelector(s) !== null", arg=HEATMAP, timeout=300_000)
                warm.close()
                spy = None
                if args.profile:
                    import shutil
                    import subprocess

                    # on PATH, or beside this Python (a venv that was not activated)
                    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
                    Path(args.profile).mkdir(parents=True, exist_ok=True)
                    out = Path(args.profile) / f"{way.split()[0]}-{size}.json"
                    spy = subprocess.Popen([py_spy, "record", "--pid", str(proc.pid), "--format", "speedscope",
                                            "--output", str(out), "--threads", "--rate", "50", "--nonblocking"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                runs[f"{way}, {size}"] = run_class(browser, url, proc.pid, photos, args.spread, size)
                if spy is not None:
                    import signal

                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
    mb = statistics.median(len(p) for p in photos) / 1e6
    print(f"\n{args.sessions} sessions upload a 12 MP photo each ({args.content} content, median {mb:.2f} MB) within "
          f"{args.spread:.0f} s (one Chromium, one server, same machine), through each way of starting the server and "
          f"page size; load average {' '.join(f'{x:.1f}' for x in psutil.getloadavg())} after:\n")
    print(f"| measure | {' | '.join(runs)} | target |")
    print("|---|" + "---|" * len(runs) + "---|")
    rows = (("median upload → heatmap", lambda r: f"{r.median:.2f} s", "≤ 3 s"),
            ("p95 upload → heatmap", lambda r: f"{r.p95:.2f} s", "≤ 5 s"),
            ("slowest", lambda r: f"{max(r.waits):.2f} s", ""),
            ("server CPU per upload", lambda r: f"{r.cpu_per_upload:.3f} s", "≤ 0.15 s"),
            ("… in page runs / the event loop / other threads",
             lambda r: " / ".join(f"{x * 1000:.0f}" for x in r.cpu_split) + " ms", ""),
            ("server memory afterwards", lambda r: f"{r.rss_after / 2**30:.2f} GB", "≤ 1.5 GB"),
            (f"… {SETTLE_S:.0f} s later", lambda r: f"{r.rss_settled / 2**30:.2f} GB", ""))
    for name, cell, target in rows:
        print(f"| {name} | {' | '.join(cell(r) for r in runs.values())} | {target} |")

if __name__ == "__main__":
    main()
