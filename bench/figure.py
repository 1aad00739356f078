"""``python -m bench.figure``: how long a figure for a paper takes (target: a six-panel PDF at 300 dpi ≤ 2 s).

The offline ViT-S/14 at 196 px on the cat photo, captured once; then, per repeat, ``attnviz.figure``
composes and writes the figure (what ``attnviz figure`` does after the model has run). Prints a Markdown
table of medians. The machine's other load is not controlled: say so when quoting the numbers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from PIL import Image

import attnviz
from attnviz import figure
from attnviz.photos import sample

CASES = {  # name: (layers 0-based, heads, views)
    "6 panels (layers 1, 6, 12 × mean, head 1)": ((0, 5, 11), ("mean", 0), ("cls",)),
    "6 panels + rollout + heads grid of 3 layers": ((0, 5, 11), ("mean", 0), ("cls", "rollout", "heads")),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dpi", type=int, default=300)
    args = parser.parse_args()
    model = attnviz.load_model(device="cpu")
    cap = attnviz.capture(model, Image.open(sample("cat")))
    figure.to_bytes(figure.compose(cap, (11,)), "pdf")  # fonts and the first draw out of the way
    print(f"attnviz figure, {model.public_name} at {model.size} px, {args.dpi} dpi, median of {args.repeats} "
          f"({os.cpu_count()} CPUs, shared with other work)\n")
    print("| figure | format | compose + write, s | file, kB |")
    print("|---|---|---|---|")
    for name, (layers, heads, views) in CASES.items():
        for fmt in ("pdf", "svg", "png"):
            times, size = [], 0
            for _ in range(args.repeats):
                start = time.perf_counter()
                data = figure.to_bytes(figure.compose(cap, layers, heads, views), fmt, args.dpi)
                times.append(time.perf_counter() - start)
                size = len(data)
            print(f"| {name} | {fmt} | {statistics.median(times):.2f} | {size / 1000:.0f} |")


if __name__ == "__main__":
    main()
