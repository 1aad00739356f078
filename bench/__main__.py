"""``python -m bench``: attnviz against the floor and its peers, side by side in one process.

Prints one Markdown table per measurement (medians over repeated, interleaved runs) with ratios to
the floor, timm's own fused forward pass on the same weights. ``--quick`` takes fewer repeats,
``--no-browser`` skips the Chromium timings (upload, Layer change and the live camera's fps and
latency), ``--sizes`` picks input sizes.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]

import attnviz
from attnviz import render
from attnviz.rollout import cls_rollout_grid
from bench.peers import hf_dinov2

ROOT = Path(__file__).resolve().parents[1]
ASSETS = Path(attnviz.__file__).with_name("assets")  # the sample photos the package ships

PHOTO = ASSETS / "cat.jpg"


def medians(fns: dict, repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds of each function; runs are interleaved so drift hits every method alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for r in range(repeats):
        names = list(fns)
        names = names[r % len(names):] + names[: r % len(names)]
        for name in names:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}



def floor_and_capture(model, x, repeats: int) -> dict[str, float]:
    """Median seconds of the network's own forward pass ("floor") and of attnviz's capture of it ("capture") on ``x``,
    interleaved (:func:`medians`), each waiting for a GPU to finish."""
    import torch

    from attnviz.capture import capture_tensor

    def finished(fn):
        def run():
            fn()
            if x.device.type == "cuda":
                torch.cuda.synchronize()
        return run

    with torch.inference_mode():
        return medians({"floor": finished(lambda: model.network(x)),
                        "capture": finished(lambda: capture_tensor(model, x))}, repeats)


def eager_copy(network: torch.nn.Module) -> torch.nn.Module:
    """The peers need timm's eager path (its fused path never produces the weights)."""
    net = copy.deepcopy(network)
    for block in net.blocks:
        block.attn.fused_attn = False
    return net


def capture_table(sizes: list[int], repeats: int, device: str) -> list[dict]:
    from timm.utils import AttentionExtract

    rows = []
    hf = hf_dinov2().to(device)
    for size in sizes:
        model = attnviz.load_model(size=size, device=device)
        x = model.to_input(model.view(Image.open(PHOTO)))
        eager = eager_copy(model.network)
        extract = AttentionExtract(eager, method="fx")
        kept: list[torch.Tensor] = []
        hooks = [b.attn.attn_drop.register_forward_hook(lambda m, i, o: kept.append(o)) for b in eager.blocks]

        def sync(fn):
            def run():
                with torch.inference_mode():
                    fn()
                if device == "cuda":
                    torch.cuda.synchronize()
            return run

        def drop_hooks():
            kept.clear()
            eager(x)

        t = medians({
            "floor": sync(lambda: model.network(x)),
            "attnviz": sync(lambda: attnviz.capture_tensor(model, x)),
            "attn_drop hooks": sync(drop_hooks),
            "timm AttentionExtract": sync(lambda: extract(x)),
            "HF eager + output_attentions": sync(lambda: hf(pixel_values=x, output_attentions=True)),
        }, repeats)
        for h in hooks:
            h.remove()
        cap = attnviz.capture_tensor(model, x)
        all_maps = cap.num_layers * cap.num_heads * cap.num_tokens**2 * 4
        rows.append(dict(size=size, n=cap.num_tokens, times=t, held=cap.nbytes, all_maps=all_maps))
    return rows


def redraw_times(sizes: list[int], repeats: int, device: str) -> list[dict]:
    """Capture → finished RGB overlay (what a Layer / Head / opacity change costs; no model run)."""
    rows = []
    for size in sizes:
        model = attnviz.load_model(size=size, device=device)
        photo = Image.open(PHOTO)
        view = model.view(photo)
        cap = attnviz.capture(model, photo)
        layers = iter(range(10**9))

        def redraw():
            layer = next(layers) % cap.num_layers  # a different layer every time, as a user would
            render.overlay(view, cap.cls_map(layer, "mean"), alpha=0.6, cmap="inferno")

        t = medians({"redraw": redraw, "rollout": lambda: cls_rollout_grid(cap)}, repeats)
        rows.append(dict(size=size, redraw=t["redraw"], rollout=t["rollout"]))
    return rows


COLD = """
import time; t = [time.perf_counter()]
import torch; t.append(time.perf_counter())
import torchvision; t.append(time.perf_counter())  # timm imports it; it imports torch._dynamo
import timm; t.append(time.perf_counter())
import attnviz; t.append(time.perf_counter())
m = attnviz.load_model(device="cpu"); t.append(time.perf_counter())
print(time.time(), *(b - a for a, b in zip(t, t[1:])))
"""
COLD_STEPS = ("torch", "torchvision", "timm", "attnviz", "load")


def cold_load() -> dict[str, float]:
    """Fresh processes, each step's seconds (median of 3) and from spawn to a ready model:
    with the cached converted weights, and the first-ever load (sha256 check + conversion)."""
    def run(env) -> dict[str, float]:
        start = time.time()  # wall clock: the child reports when its model was ready (before its exit)
        out = subprocess.run([sys.executable, "-c", COLD], cwd=ROOT, env={**os.environ, **env},
                             capture_output=True, text=True, check=True)
        ready, *steps = map(float, out.stdout.split()[-len(COLD_STEPS) - 1:])
        return {"process": ready - start, **dict(zip(COLD_STEPS, steps))}

    runs = [run({}) for _ in range(3)]
    with tempfile.TemporaryDirectory() as empty:
        first = run({"ATTNVIZ_CACHE": empty})
    return {**{k: statistics.median(r[k] for r in runs) for k in ("process", *COLD_STEPS)},
            "first_load": first["load"]}


def browser_times(repeats: int) -> dict[str, float]:
    from tests.serve import chromium, chromium_path, streamlit_server

    if chromium_path() is None:
        return {}
    heat = "[data-testid='stImage'] img"
    photos = ["coffee.jpg", "astronaut.jpg", "rocket.jpg", "cat.jpg"]
    upload, layer = [], []
    launched = time.perf_counter()
    with streamlit_server() as (url, _), chromium() as browser:
        up = time.perf_counter()
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(url)  # the first visit to a fresh server: imports, model load, capture of the sample photo
        page.wait_for_function("s => { const i = document.querySelector(s); return i && i.complete; }",
                               arg=heat, timeout=120_000)
        first = time.perf_counter()
        page.get_by_text("Upload a photo", exact=True).click()
        file_input = page.locator("input[type=file]")
        file_input.set_input_files(str(ASSETS / "cat.jpg"))  # warms the model
        page.get_by_text("Layer 12, mean of all heads").wait_for(timeout=120_000)
        wait_new = "([s, old]) => { const i = document.querySelector(s); return i && i.src !== old && i.complete; }"
        for r in range(repeats):
            # a fresh image each time (not cached): upload → heatmap
            photo = Image.open(ASSETS / photos[r % len(photos)]).rotate(r + 1)
            path = Path(tempfile.mkdtemp()) / f"photo{r}.png"
            photo.save(path)
            page.wait_for_selector("[data-testid='stStatusWidget']", state="detached", timeout=60_000)
            old = page.locator(heat).first.get_attribute("src")
            start = time.perf_counter()
            file_input.set_input_files(str(path))
            page.wait_for_function(wait_new, arg=[heat, old], timeout=60_000)
            upload.append(time.perf_counter() - start)
            path.unlink()
            # a Layer change → new heatmap; timed from the key press that the slider took
            title = page.locator("h3").filter(has_text="Layer").first
            now = int(re.search(r"Layer (\d+),", title.inner_text()).group(1))
            target = now - 1 if now > 1 else now + 1
            old = page.locator(heat).first.get_attribute("src")
            for _ in range(5):
                start = time.perf_counter()
                page.get_by_role("slider", name="Layer").press("ArrowLeft" if target < now else "ArrowRight")
                try:
                    page.get_by_text(f"Layer {target},").first.wait_for(timeout=5_000)
                    break
                except Exception:  # a key pressed while the page was re-running is lost: press again
                    continue
            page.wait_for_function(wait_new, arg=[heat, old], timeout=60_000)
            layer.append(time.perf_counter() - start)
    return {"server": up - launched, "first_visit": first - up,
            "upload": statistics.median(upload), "layer": statistics.median(layer)}


def fmt_ms(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s >= 0.01 else f"{s * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--sizes", type=int, nargs="+", default=[196, 224, 448, 518])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="5 repeats")
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write the raw numbers here")
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats
    dev = args.device
    print(f"attnviz benchmark — torch {torch.__version__}, {torch.get_num_threads()} threads, device {dev}, "
          f"{repeats} repeats, medians\n")

    caps = capture_table(args.sizes, repeats, dev)
    peers = ["attnviz", "attn_drop hooks", "timm AttentionExtract", "HF eager + output_attentions"]
    print("| input | N | timm fused forward (floor) | " + " | ".join(peers) + " |")
    print("|---|---|---|" + "---|" * len(peers))
    for r in caps:
        t = r["times"]
        cells = [f"{fmt_ms(t[p])} ({t[p] / t['floor']:.2f}×)" for p in peers]
        print(f"| {r['size']} px | {r['n']} | {fmt_ms(t['floor'])} | " + " | ".join(cells) + " |")

    print("\n| input | memory held by one capture | all L×H N×N maps in fp32 | target |")
    print("|---|---|---|---|")
    for r in caps:
        target = {196: "≤ 8 MB", 518: "≤ 64 MB"}.get(r["size"], "")
        print(f"| {r['size']} px | {r['held'] / 2**20:.1f} MB | {r['all_maps'] / 2**20:.0f} MB | {target} |")

    draws = redraw_times(args.sizes, max(repeats, 10), dev)
    print("\n| input | re-draw after a Layer/Head change (capture → RGB overlay) | rollout of all layers |")
    print("|---|---|---|")
    for r in draws:
        print(f"| {r['size']} px | {fmt_ms(r['redraw'])} | {fmt_ms(r['rollout'])} |")

    cold = cold_load()
    ours = cold["attnviz"] + cold["load"]
    print(f"\nFresh process to a ready model (cached converted weights) {cold['process']:.2f} s: import torch "
          f"{cold['torch']:.2f} s, torchvision {cold['torchvision']:.2f} s, timm {cold['timm']:.2f} s, then attnviz "
          f"{cold['attnviz']:.2f} s and load_model() {cold['load']:.2f} s (ours: {ours:.2f} s). "
          f"First-ever load_model() (sha256 check + ONNX conversion) {cold['first_load']:.2f} s")

    web = {} if args.no_browser else browser_times(max(3, repeats // 2))
    if web:
        print(f"\nHeadless Chromium, warm model, 196 px: upload → heatmap {web['upload']:.2f} s; "
              f"Layer change → new heatmap {web['layer']:.2f} s. A fresh server answers in {web['server']:.1f} s; "
              f"its first visitor sees the first heatmap {web['first_visit']:.1f} s after opening the page")
    live = {}
    if web:  # Chromium is there
        from bench.live import line, live_speed  # the live camera (python -m bench.live: that line alone)

        live = live_speed()
        print("\n" + line(live))
    if args.json:
        Path(args.json).write_text(
            json.dumps(dict(captures=caps, redraw=draws, cold=cold, browser=web, live=live), indent=1)
        )


if __name__ == "__main__":
    main()
