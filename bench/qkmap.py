"""``python -m bench.qkmap``: what the Q/K map costs (issue #21) — one head's map after the capture, the
L × H atlas, and ~79 000 points drawn in headless Chromium by the Dataset page's WebGL scatter and, side by
side, by the Altair chart (Vega's canvas renderer) it replaced there.

Targets: PCA map of one head ≤ 50 ms; atlas ≤ 1 s; 200 photos × 394 points drawn ≤ 2 s and pannable.
The offline ViT-S/14 at 196 px (N = 197, so 394 points a photo). Medians of repeated runs. The browser
part serves ``bench/qk_page.py`` with the real Streamlit server and draws the Dataset page's map of 200
photos both ways (:mod:`attnviz_app.qk_scatter`; :func:`attnviz_app.dataset_qk.chart`), their page loads
in turn: ``--distinct`` (default 20) real captures of the four sample photos under random crops, cycled
(capturing 200 would take minutes on a busy machine and costs the browser nothing more). ``--no-browser``
leaves it out, ``--photos`` sets how many it draws.
``QK_BENCH_TSNE=1`` and ``QK_BENCH_UMAP=1`` also time t-SNE and UMAP (UMAP's first call separately: it compiles).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench import machine

ROOT = Path(__file__).resolve().parents[1]


def median_ms(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def library(repeats: int) -> list[tuple[str, float, str]]:
    import attnviz
    from attnviz import qkmap

    model = attnviz.load_model(device="cpu")
    cap = attnviz.capture(model, attnviz.load_photo(attnviz.photos.sample("cat"), model).image)
    layer, head = 5, 2
    rows = [
        ("PCA map of one head (`qk_map`, AttentionViz normalisation)",
         median_ms(lambda: qkmap.qk_map(cap, layer, head), repeats), "≤ 50 ms"),
        ("… without normalisation", median_ms(lambda: qkmap.qk_map(cap, layer, head, normalize="none"), repeats), ""),
        ("its measured statistics (`statistics`, 38 809 pairs)",
         median_ms(lambda: qkmap.statistics(qkmap.qk_map(cap, layer, head)), repeats)
         - median_ms(lambda: qkmap.qk_map(cap, layer, head), repeats), ""),
        ("map + statistics + colour values (what the view computes)",
         median_ms(lambda: (lambda qk: (qkmap.statistics(qk), qkmap.colour_values(qk, cap, "brightness")))(
             qkmap.qk_map(cap, layer, head)), repeats), ""),
        (f"head atlas, all {cap.num_layers} × {cap.num_heads} heads (`atlas`)",
         median_ms(lambda: qkmap.atlas(cap), max(3, repeats // 4)), "≤ 1 s"),
        ("… and its picture (`atlas_picture`)",
         median_ms(lambda: qkmap.atlas_picture(qkmap.atlas(cap)), max(3, repeats // 4)), "≤ 1 s"),
    ]
    if os.environ.get("QK_BENCH_TSNE"):  # ~15–45 s on a busy 2-core machine
        rows.append(("t-SNE map of one head (scikit-learn)",
                     median_ms(lambda: qkmap.qk_map(cap, layer, head, method="tsne"), 3, warmup=1), ""))
    if os.environ.get("QK_BENCH_UMAP"):  # the first call compiles umap-learn's numba code (tens of seconds)
        start = time.perf_counter()
        qkmap.qk_map(cap, layer, head, method="umap")
        rows.append(("UMAP map of one head (umap-learn): first call in a process (import, numba compiling)",
                     1000 * (time.perf_counter() - start), ""))
        rows.append(("… every call after it",
                     median_ms(lambda: qkmap.qk_map(cap, layer, head, method="umap"), 5, warmup=0), ""))
    return rows


def many_captures(count: int, distinct: int):
    """``count`` captures: ``distinct`` real ones (the four sample photos under random crops, seeded), cycled."""
    import attnviz
    from attnviz import photos

    model = attnviz.load_model(device="cpu")
    rng = np.random.default_rng(0)
    pictures = [attnviz.load_photo(photos.sample(name), model).image for name in photos.SAMPLES]
    caps = []
    for i in range(min(count, distinct)):
        image = pictures[i % len(pictures)]
        w, h = image.size
        side = int(min(w, h) * rng.uniform(0.6, 1.0))
        left, top = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
        caps.append(attnviz.capture(model, image.crop((left, top, left + side, top + side))))
    return [caps[i % len(caps)] for i in range(count)]


# Page loaded → picture painted: Vega's canvas holds coloured pixels; the WebGL canvas has drawn a frame.
VEGA_PAINTED = """() => { const c = document.querySelector('[data-testid="stVegaLiteChart"] canvas');
    if (!c || !c.width) return false;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let coloured = 0;
    for (let i = 0; i < d.length; i += 4 * 97) if (Math.max(d[i], d[i+1], d[i+2]) - Math.min(d[i], d[i+1], d[i+2]) > 60) coloured++;
    return coloured > 200; }"""
WEBGL_PAINTED = "() => Number(document.querySelector('canvas.qk-canvas')?.dataset.frames || 0) >= 1"
NEXT_FRAME = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
# The WebGL canvas's coloured pixels (read back once, after timing: the tests check them point by point).
WEBGL_COLOURED = """async c => { const img = new Image(); img.src = c.toDataURL(); await img.decode();
    const k = document.createElement('canvas'); k.width = c.width; k.height = c.height;
    const g = k.getContext('2d'); g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, k.width, k.height).data;
    let coloured = 0;
    for (let i = 0; i < d.length; i += 4)
      if (d[i+3] && Math.max(d[i], d[i+1], d[i+2]) - Math.min(d[i], d[i+1], d[i+2]) > 60) coloured++;
    return coloured; }"""
DRAWS = {  # how each way is drawn: the page's query, the picture's canvas, what says it is painted
    "vega": ("?draw=vega", "[data-testid='stVegaLiteChart'] canvas", VEGA_PAINTED),
    "webgl": ("?draw=webgl", "canvas.qk-canvas", WEBGL_PAINTED),
}


def browser(photos: int, distinct: int, loads: int = 3) -> list[tuple[str, float, str]]:
    """The Altair chart (Vega's canvas) and the WebGL scatter of the same map, loaded in turn, ``loads`` each."""
    from tests.serve import chromium, streamlit_server

    from attnviz import qkmap

    start = time.perf_counter()
    caps = many_captures(photos, distinct)
    captured = time.perf_counter() - start
    start = time.perf_counter()
    qk = qkmap.qk_map(caps, 5, 2)
    mapped = time.perf_counter() - start
    values = qkmap.colour_values(qk, caps, "row") + 1
    light = dataclasses.replace(qk, vectors=np.empty((0, 0)), logits=(qk.logits[0],))
    load = {way: [] for way in DRAWS}
    pan = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "map.pkl"
        data.write_bytes(pickle.dumps((light, values, [f"photo {i + 1}" for i in range(photos)])))
        launcher = [sys.executable, "-m", "streamlit", "run", str(ROOT / "bench" / "qk_page.py")]
        with streamlit_server(env={"QK_BENCH_DATA": str(data)}, launcher=launcher) as (url, _), chromium() as b:
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url + DRAWS["vega"][0])  # the server reads the saved map once, before any timing
            page.wait_for_function(VEGA_PAINTED, timeout=120_000, polling=100)
            for _ in range(loads):
                for way, (query, _, painted) in DRAWS.items():
                    t0 = time.perf_counter()
                    page.goto(url + query)
                    page.wait_for_function(painted, timeout=120_000, polling=20)
                    page.evaluate(NEXT_FRAME)  # on screen
                    load[way].append(time.perf_counter() - t0)
            for way, (query, canvas, painted) in DRAWS.items():
                page.goto(url + query)
                page.wait_for_function(painted, timeout=120_000, polling=20)
                if way == "webgl":
                    coloured = page.locator(canvas).first.evaluate(WEBGL_COLOURED)
                    assert coloured > 10_000, f"the WebGL canvas has only {coloured} coloured pixels"
                pan[way] = pan_step(page, canvas)
    points = len(qk.token)
    vega, webgl = statistics.median(load["vega"]), statistics.median(load["webgl"])
    return [
        (f"the chart's {photos} photos: {min(photos, distinct)} real captures, cycled (not part of the page)",
         1000 * captured, ""),
        (f"PCA map of one head over {photos} photos ({points:,} points)", 1000 * mapped, ""),
        (f"{points:,} points, Altair (Vega's canvas): page load → canvas painted", 1000 * vega, "≤ 2 s"),
        (f"{points:,} points, WebGL scatter: page load → first frame painted", 1000 * webgl, "≤ 2 s"),
        (f"{points:,} points, Altair (Vega's canvas): one pan step (drag, until the next frame)", 1000 * pan["vega"],
         "pannable"),
        (f"{points:,} points, WebGL scatter: one pan step (drag, until the next frame)", 1000 * pan["webgl"],
         "pannable"),
    ]


def pan_step(page, canvas: str, steps: int = 20) -> float:
    """Seconds a drag step takes, until the next frame: the mouse drags the picture ``steps`` times."""
    box = page.locator(canvas).first.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    t0 = time.perf_counter()
    for i in range(steps):
        page.mouse.move(x + 8 * (i + 1), y + 3 * (i + 1))
        page.evaluate(NEXT_FRAME)
    seconds = (time.perf_counter() - t0) / steps
    page.mouse.up()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--photos", type=int, default=200)
    parser.add_argument("--distinct", type=int, default=20, help="real captures among --photos (cycled; capturing is slow)")
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--browser-only", action="store_true")
    args = parser.parse_args(argv)
    rows = [] if args.browser_only else library(args.repeats)
    if not args.no_browser:
        rows += browser(args.photos, args.distinct)
    load = os.getloadavg()[0]
    print(f"Q/K map, offline ViT-S/14 at 196 px, {os.cpu_count()} CPUs, load average {load:.1f} at the end "
          "(the machine may be shared: other work slows these numbers)")
    print(f"machine: {machine.describe()}\n")
    print("| what | median | target |\n|---|---|---|")
    for what, ms, target in rows:
        shown = f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"
        print(f"| {what} | {shown} | {target} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
