"""``python -m bench.dataset``: images per second of ``python -m attnviz dataset`` on this machine.

Prints Markdown tables:

1. where one image's time goes: the capture (one forward pass, batched or not) and the per-head
   statistics (head_stats over every layer, plus 72 CLS maps and mass masks);
2. the local engine at ``--batch`` 1, 4 and 8, torch on all cores;
3. the ray engine with 1 worker (all cores) and 2 workers (one core each), batches of 2: the rate
   over the whole run, the rate after the first batch landed (once Ray, the actors and their models
   have started), and the seconds until then.

The photos are variants (mirrored, cropped, turned) of the four samples in assets/, each its own file.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image, ImageOps

from attnviz import dataset
from attnviz.capture import capture_tensor
from attnviz.dataset import RunConfig
import attnviz

ASSETS = Path(attnviz.__file__).with_name("assets")  # the sample photos the package ships


def photos(folder: Path, count: int) -> Path:
    """``count`` distinct photos made from the samples (4 sources × mirror × crop × turn)."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = sorted(ASSETS.glob("*.jpg"))
    for i in range(count):
        im = Image.open(sources[i % len(sources)]).convert("RGB")
        variant = i // len(sources)
        if variant & 1:
            im = ImageOps.mirror(im)
        if variant & 2:
            w, h = im.size
            im = im.crop((w // 8, h // 8, w - w // 8, h - h // 8))
        if variant & 4:
            im = im.rotate(90, expand=True)
        im.save(folder / f"photo_{i:03d}.jpg", quality=92)
    return folder


def time_split(size: int, repeats: int) -> dict:
    """Median ms per image of the capture and of the statistics, on the sample photos."""
    model = RunConfig(size=size).load()
    items = dataset.read_items([str(p) for p in sorted(ASSETS.glob("*.jpg"))])
    x = torch.cat([model.to_input(model.view(Image.open(p).convert("RGB"))) for p, _ in items])  # (4, 3, S, S)
    one, stats = [], []
    capture_tensor(model, x[:1])
    for _ in range(repeats):
        start = time.perf_counter()
        caps = [capture_tensor(model, x[i : i + 1]) for i in range(len(x))]
        one.append((time.perf_counter() - start) / len(x))
        start = time.perf_counter()
        dataset.head_values(caps[0])
        stats.append(time.perf_counter() - start)
    ms = lambda ts: 1000 * statistics.median(ts)  # noqa: E731
    return {"size": size, "capture": ms(one), "stats": ms(stats)}


def local_rate(folder: Path, size: int, batch: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        summary = dataset.run_local(folder, Path(out) / "run", RunConfig(size=size), batch=batch, progress=False)
    return summary.images / summary.seconds


def ray_rates(folder: Path, size: int, workers: int, batch: int) -> tuple[float, float, float]:
    """(images/s including Ray's start-up, images/s after the first batch, seconds to the first batch)."""
    from attnviz.dataset_ray import run_ray

    cpus = max(1, torch.get_num_threads() // workers)
    with tempfile.TemporaryDirectory() as out:
        run = run_ray(folder, Path(out) / "run", RunConfig(size=size), batch=batch, workers=workers,
                      cpus_per_worker=cpus, progress=False)
    return run.images / run.seconds, run.steady_per_second, run.first_seconds


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dataset")
    parser.add_argument("--sizes", type=int, nargs="+", default=[196, 518])
    parser.add_argument("--images", type=int, default=16, help="photos per run at 196 px (a quarter at 518 px)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, all cores)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; numbers from one run each, "
          "on a shared machine they vary by ±30 %\n")

    print("| input | capture (per image) | statistics (per image) |")
    print("|---|---|---|")
    for size in args.sizes:
        s = time_split(size, args.repeats)
        print(f"| {size} px | {s['capture']:.0f} ms | {s['stats']:.0f} ms |", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        counts = {size: args.images if size <= 224 else max(4, args.images // 4) for size in args.sizes}
        folders = {n: photos(tmp / f"photos{n}", n) for n in set(counts.values())}
        print("\n| input | photos | local, batch 1 | local, batch 4 | local, batch 8 |")
        print("|---|---|---|---|---|")
        for size in args.sizes:
            rates = [local_rate(folders[counts[size]], size, b) for b in (1, 4, 8)]
            print(f"| {size} px | {counts[size]} | " + " | ".join(f"{r:.2f} img/s" for r in rates) + " |", flush=True)
        if args.no_ray:
            return
        print("\n| input | photos | Ray, 1 worker × 2 cores | Ray, 2 workers × 1 core | "
              "(each: all / after the first batch / s to the first batch) |")
        print("|---|---|---|---|---|")
        for size in args.sizes:
            cells = []
            for workers in (1, 2):
                total, steady, first = ray_rates(folders[counts[size]], size, workers, batch=2)
                cells.append(f"{total:.2f} / {steady:.2f} img/s / {first:.0f} s")
            print(f"| {size} px | {counts[size]} | " + " | ".join(cells) + " | |", flush=True)


if __name__ == "__main__":
    main()
