"""``python -m bench.faithfulness``: what "does attention explain?" costs on one photo.

The offline ViT-S/14 on the cat photo at 196 px (``--size``): every map's deletion and insertion
curves (12 layers' head-mean attention, rollout, token norms, 5 random orders; 10 % steps) for each
fill, and the full 12 × 6 head-ablation grid. Prints one Markdown table with the number of forward
passes each costs, the seconds (median of ``--repeats``), and the machine's load, since a shared
machine's numbers say as much about the neighbours as about attnviz.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import attnviz
import attnviz.interventions as interventions
from attnviz import ablation
from attnviz import faithfulness as fa

TARGET_S = 4.0


def seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def tokens_run(fn) -> int:
    """Tokens that went through the blocks while ``fn()`` ran (batch rows × sequence length, summed)."""
    seen = [0]
    plain = interventions.run_blocks

    def counted(network, x, *args, **kwargs):
        seen[0] += x.shape[0] * x.shape[1]
        return plain(network, x, *args, **kwargs)

    interventions.run_blocks = counted
    try:
        fn()
    finally:
        interventions.run_blocks = plain
    return seen[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=196)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--fills", default="token,mean", help="comma-separated fills to time (token, mean, blur)")
    args = parser.parse_args(argv)

    model = attnviz.load_model(size=args.size, device="cpu")
    cap = attnviz.capture(model, attnviz.load_photo(attnviz.photos.sample("cat"), model).image)
    rankings, _ = fa.standard_rankings(model, cap)
    forward = seconds(lambda: model.adapter.forward_batch(model.network, cap.input.expand(16, -1, -1, -1)), 2) / 16
    rows = []
    for fill in args.fills.split(","):
        s = seconds(lambda: fa.faithfulness(model, cap, rankings, fill=fill), args.repeats)
        inputs = fa.faithfulness(model, cap, rankings[:1], fill=fill).inputs
        inputs = 2 + (inputs - 2) * len(rankings)  # the untouched and the empty photo once, the rest per ranking
        rows.append((f"all maps' curves, fill {fill} ({len(rankings)} rankings)", f"{inputs} inputs", s))
    depth, heads = model.depth, model.num_heads
    s = seconds(lambda: ablation.head_ablation(model, cap), max(args.repeats, 2))
    rows.append((f"head-ablation grid ({depth} × {heads} heads)",
                 f"{heads * depth * (depth + 1) // 2} block passes = {heads * (depth + 1) / 2:.1f} forwards", s))

    load = os.getloadavg()
    print(f"offline ViT-S/14, cat photo, {args.size} px (N = {model.num_tokens}), torch threads "
          f"{torch.get_num_threads()}, {os.cpu_count()} CPUs; load average {load[0]:.1f} / {load[1]:.1f} / "
          f"{load[2]:.1f} (1 / 5 / 15 min): the machine was shared while this ran.")
    print(f"plain forward pass, batch of 16: {forward * 1000:.0f} ms per image\n")
    print("| what | work | seconds | in plain forward passes | target |")
    print("|---|---|---|---|---|")
    for what, work, s in rows:
        print(f"| {what} | {work} | {s:.2f} | {s / forward:.0f} | ≤ {TARGET_S:.0f} s "
              f"{'met' if s <= TARGET_S else 'missed'} |")
    if "token" in args.fills.split(","):
        # The floor of token removal: every kept token of every distinct input passes all the blocks once.
        # At the plain forward pass's own rate (tokens per second, batch of 16) that work cannot take less.
        tokens = tokens_run(lambda: fa.faithfulness(model, cap, rankings, fill="token"))
        equivalent = tokens / model.num_tokens
        print(f"\nToken removal runs {tokens:,} tokens through the {depth} blocks: {equivalent:.0f} plain forward "
              f"passes' worth, so at the plain forward pass's rate ({forward * 1000:.0f} ms per {model.num_tokens} "
              f"tokens, batch of 16) all maps' curves cannot take less than {equivalent * forward:.1f} s "
              f"(target {TARGET_S:.0f} s).")


if __name__ == "__main__":
    main()
