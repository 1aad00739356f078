"""Command line: ``python -m attnviz export IMAGE... --out DIR [--model NAME] [--size PX]``.

Per image writes ``DIR/<stem>.npz`` (``attention`` (L, H, N, N) float32, ``input`` (1, 3, S, S),
``grid`` (h, w), ``num_prefix_tokens``; with ``--rollout`` also ``rollout`` (h, w)) and ``DIR/<stem>_overlay.png`` (last layer, mean of heads).
A bad file gets one line on stderr naming it; the others are still written; the exit code is 1.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from . import capture, dataset_cli, load_model, render
from .rollout import cls_rollout_grid
from .images import ImageError, open_image
from .models import ModelError


def safe_stem(path: str) -> str:
    """A file-name stem with no directories, dots-only names or odd characters (no path traversal)."""
    stem = re.sub(r"[^\w\-]+", "_", Path(path).stem, flags=re.ASCII).strip("_.")
    return stem or "image"


def export_one(model, path: Path, out: Path, stem: str, with_rollout: bool = False) -> None:
    checked = open_image(path.read_bytes(), path.name)
    cap = capture(model, checked.image)
    arrays = {
        "attention": cap.all_weights(),  # (L, H, N, N) float32
        "input": cap.input.cpu().numpy(),  # (1, 3, S, S)
        "grid": np.array(cap.grid),
        "num_prefix_tokens": np.array(cap.num_prefix_tokens),
    }
    if with_rollout:
        arrays["rollout"] = cls_rollout_grid(cap)  # (h, w): CLS rollout, head mean, no discard, residual 0.5
    np.savez_compressed(out / f"{stem}.npz", **arrays)
    view = model.view(checked.image)
    render.overlay(view, cap.cls_map(cap.num_layers - 1, "mean")).save(out / f"{stem}_overlay.png")


def export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    try:
        model = load_model(args.model, args.size, checkpoint=args.checkpoint, device=args.device)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed, used = 0, set()
    for name in tqdm(args.images, unit="image", disable=len(args.images) < 2 or args.quiet):
        path, stem = Path(name), safe_stem(name)
        while stem in used:  # two inputs named alike must not overwrite each other
            stem += "_"
        used.add(stem)
        try:
            if not path.is_file():
                raise ImageError(f"{name} is not a file." if path.exists() else f"{name} does not exist.")
            export_one(model, path, out, stem, args.rollout)
        except ImageError as e:
            tqdm.write(f"error: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnviz", description="See what a Vision Transformer attends to.")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write every layer's and head's attention for images to .npz and .png")
    ex.add_argument("images", nargs="+", help="image files")
    ex.add_argument("--out", required=True, help="output folder")
    ex.add_argument("--model", default=None, help="timm model name (default: the offline ViT-S/14)")
    ex.add_argument("--checkpoint", default=None, help="local .safetensors file for --model's architecture")
    ex.add_argument("--size", type=int, default=None, help="input size in pixels (default 196 for the offline model)")
    ex.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    ex.add_argument("--rollout", action="store_true", help="also write `rollout`: the CLS attention rollout on the grid")
    ex.add_argument("--quiet", action="store_true", help="no progress bar")
    dataset_cli.add_parser(sub)
    args = parser.parse_args(argv)
    return dataset_cli.run(args) if args.command == "dataset" else export(args)
