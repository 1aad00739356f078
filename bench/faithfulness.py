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
from attnviz import ablation, runtimes
from attnviz.jobs import core_count
from attnviz import faithfulness as fa
from bench import machine

TARGET_S = 4.0


def seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def block_flops(n: int, dim: int, mlp: int) -> float:
    """Floating-point operations of one pre-norm ViT block on one sequence of ``n`` tokens (a multiply-add is
    two): q, k, v and the output projection (4 n D²), the MLP (2 n D · mlp), q kᵀ and the weights times v (2 n² D)."""
    return 2.0 * (4 * n * dim * dim + 2 * n * dim * mlp + 2 * n * n * dim)


def tokens_work(fn, depth: int, dim: int, mlp: int) -> float:
    """Floating-point operations of the blocks run while ``fn()`` ran (every batch row and sequence length)."""
    seen = [0.0]
    plain = interventions.run_blocks

    def counted(network, x, *args, **kwargs):
        seen[0] += x.shape[0] * depth * block_flops(x.shape[1], dim, mlp)
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fills", default="token,mean", help="comma-separated fills to time (token, mean, blur)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU (PyTorch alone there)")
    parser.add_argument("--runtimes", default=",".join(runtimes.installed()),
                        help="CPU runtimes to time token removal on beside PyTorch (attnviz.fast), comma-separated")
    args = parser.parse_args(argv)

    model = attnviz.load_model(size=args.size, device=args.device)
    cap = attnviz.capture(model, attnviz.load_photo(attnviz.photos.sample("cat"), model).image)
    rankings, _ = fa.standard_rankings(model, cap)
    on_gpu = model.device.type == "cuda"
    engines = {f"PyTorch on {torch.cuda.get_device_name(model.device)}" if on_gpu else
               f"PyTorch (1 thread × {core_count()} at once)": model}  # as the runtimes: one call per core
    for name in filter(None, "" if on_gpu else args.runtimes.split(",")):
        fast = attnviz.fast(model, name)
        if fast.runtime is not None and fast.runtime.removal() is not None:  # one thread per call, one call per core
            engines[f"{runtimes.RUNTIMES[name].LABEL} (1 thread × {core_count()} at once)"] = fast
    def batch_of_16() -> None:
        model.adapter.forward_batch(model.network, cap.input.expand(16, -1, -1, -1))
        if on_gpu:
            torch.cuda.synchronize()

    batch_of_16()
    forward = seconds(batch_of_16, 2) / 16
    block = model.network.blocks[0]
    work = {}  # fill → floating-point operations of the blocks
    rows = []
    for fill in args.fills.split(","):
        inputs = fa.faithfulness(model, cap, rankings[:1], fill=fill).inputs
        inputs = 2 + (inputs - 2) * len(rankings)  # the untouched and the empty photo once, the rest per ranking
        for engine, m in engines.items():
            if not engine.startswith("PyTorch") and fill != "token":
                continue  # the pixel fills run the whole network in PyTorch
            s = seconds(lambda: fa.faithfulness(m, cap, rankings, fill=fill), args.repeats)
            rows.append((f"all maps' curves, fill {fill} ({len(rankings)} rankings), {engine}", f"{inputs} inputs", s))
    depth, heads = model.depth, model.num_heads
    s = seconds(lambda: ablation.head_ablation(model, cap), max(args.repeats, 2))
    rows.append((f"head-ablation grid ({depth} × {heads} heads), PyTorch",
                 f"{heads * depth * (depth + 1) // 2} block passes = {heads * (depth + 1) / 2:.1f} forwards", s))
    if "token" in args.fills.split(","):
        work = tokens_work(lambda: fa.faithfulness(model, cap, rankings, fill="token"), depth, model.embed_dim,
                           block.mlp.fc1.out_features)

    load = os.getloadavg()
    print(f"offline ViT-S/14, cat photo, {args.size} px (N = {model.num_tokens}), torch threads "
          f"{torch.get_num_threads()}, {os.cpu_count()} CPUs; load average {load[0]:.1f} / {load[1]:.1f} / "
          f"{load[2]:.1f} (1 / 5 / 15 min) after the run; median of {args.repeats}.")
    print(f"machine: {machine.describe()}" + (f"; device {torch.cuda.get_device_name(model.device)}" if on_gpu else ""))
    print(f"plain forward pass (PyTorch), batch of 16: {forward * 1000:.{1 if on_gpu else 0}f} ms per image\n")
    print("| what | work | seconds | in plain PyTorch forward passes | target |")
    print("|---|---|---|---|---|")
    for what, done, s in rows:
        print(f"| {what} | {done} | {s:.2f} | {s / forward:.0f} | ≤ {TARGET_S:.0f} s "
              f"{'met' if s <= TARGET_S else 'missed'} |")
    if work:
        forward_flops = depth * block_flops(model.num_tokens, model.embed_dim, block.mlp.fc1.out_features)
        print(f"\nToken removal runs {work / 1e12:.2f} TFLOP through the blocks ({work / forward_flops:.0f} plain "
              "forward passes' worth, every block counted whole): " + ", ".join(
                  f"{what.rsplit(', ', 1)[1]} at {work / s / 1e9:.0f} GFLOP/s" for what, _, s in rows
                  if "fill token" in what) + ".")


if __name__ == "__main__":
    main()
