"""``python -m bench.export``: what taking a capture away costs — file exports, the interactive page, the sweep.

Each export runs in a fresh process (the offline ViT-S/14, the cat photo) so its memory is its own:
the peak resident memory of the export step is read from the kernel (VmHWM, reset just before the
export through /proc/self/clear_refs), and of the whole CLI run. ``--old`` also times what the
CLI did before (``savez_compressed`` of all weights stacked in memory).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from attnviz.photos import sample

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
from pathlib import Path

from attnviz.photos import sample
import numpy as np
from PIL import Image
import attnviz
from attnviz import export, html, sweep

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
size, what, out = int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
model = attnviz.load_model(size=size, device="cpu")
cap = attnviz.capture(model, Image.open(attnviz.photos.sample("cat")))
before = rss("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident size
start = time.perf_counter()
if what == "old":
    np.savez_compressed(out / "old.npz", attention=cap.all_weights(), input=cap.input.numpy())
    path = out / "old.npz"
elif what.startswith("html"):
    path = out / "page.html"
    path.write_text(html.page(cap, "en", source="cat.jpg"), encoding="utf-8")
elif what == "gif":
    path = out / "sweep.gif"
    path.write_bytes(sweep.sweep_gif(cap))
else:
    fmt, dtype = what.split("-")
    path = export.save_capture(out / "x.npz", cap, format=fmt, dtype=dtype,
                               about=export.describe(model, cap, "cat.jpg", export.weights_file(model)))
seconds = time.perf_counter() - start
print(json.dumps(dict(seconds=seconds, bytes=path.stat().st_size, rss_before=before, export_peak=rss("VmHWM"),
                      n=cap.num_tokens)))
"""


def run(size: int, what: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(size), what, tmp], capture_output=True,
                              text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli_peak(size: int, fmt: str) -> float:
    """Peak resident memory (bytes) of a whole ``python -m attnviz export`` run on one image."""
    with tempfile.TemporaryDirectory() as tmp:
        script = ("import resource, runpy, sys; sys.argv = sys.argv[1:]; "
                  "code = 0\ntry:\n    runpy.run_module('attnviz', run_name='__main__')\nexcept SystemExit as e:\n"
                  "    code = e.code\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024); sys.exit(code)")
        done = subprocess.run([sys.executable, "-c", script, "attnviz", "export", str(sample("cat")),
                               "--out", tmp, "--size", str(size), "--format", fmt, "--device", "cpu", "--quiet"],
                              cwd=ROOT, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.export")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per figure (median)")
    parser.add_argument("--old", action="store_true", help="also time the former savez_compressed export (~25 s)")
    args = parser.parse_args()

    def median(size, what):
        runs = sorted((run(size, what) for _ in range(args.repeats)), key=lambda r: r["seconds"])
        return runs[len(runs) // 2]

    mb = 2**20
    print("| export at 518 px (N = 1370) | seconds | file "
          "| peak memory of the export step (rise over the capture) | target |")
    print("|---|---|---|---|---|")
    cases = [("full-float32", "full, float32"), ("full-float16", "full, float16"), ("qk-float32", "qk")]
    if args.old:
        cases.append(("old", "before: savez_compressed of all weights"))
    for what, label in cases:
        r = median(518, what)
        target = "≤ 3 s, ≤ 1 GB" if what == "full-float32" else ""
        print(f"| {label} | {r['seconds']:.2f} s | {r['bytes'] / mb:.0f} MB | {r['export_peak'] / mb:.0f} MB "
              f"(+{(r['export_peak'] - r['rss_before']) / mb:.0f} MB) | {target} |")
    for fmt in ("full", "qk"):
        print(f"\nWhole CLI run, one image at 518 px, --format {fmt}: peak resident memory "
              f"{cli_peak(518, fmt) / mb:.0f} MB (importing torch, the model and its forward pass included)")

    print("\n| interactive page (--html) | N | size | build time |")
    print("|---|---|---|---|")
    for size in (196, 224, 518):
        r = median(size, "html")
        mode = "every query" if size <= 224 else "class token only"
        target = " (≤ 5 MB)" if size == 196 else ""
        print(f"| {size} px, {mode} | {r['n']} | {r['bytes'] / 1e6:.2f} MB{target} | {r['seconds']:.2f} s |")
    r = median(196, "gif")
    print(f"\nLayer sweep GIF at 196 px (12 frames, 588 px): {r['bytes'] / 1e6:.2f} MB in {r['seconds']:.2f} s")


if __name__ == "__main__":
    main()
