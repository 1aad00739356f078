"""Command line: ``attnviz export IMAGE... --out DIR [options]``.

Per image, in ``DIR``:
- ``<stem>.npz``: an uncompressed NPZ that :func:`attnviz.load_capture` reads back. ``--format full``
  (the default) holds ``attention`` (L, H, N, N) — float32, or float16 with ``--dtype float16`` —
  besides the capture's ``query`` and ``key`` (L, H, N, d_k); ``--format qk`` holds only the latter
  (every weight is recomputed from them). Both hold ``input`` (1, 3, S, S), ``output``, ``grid``,
  ``num_prefix_tokens`` and ``meta``, a JSON record of where it all came from; ``--rollout`` adds
  ``rollout`` (h, w).
- ``<stem>_overlay.png``: the last layer's class-token map, mean of heads, over the photo.
- ``<stem>.html`` with ``--html``: the self-contained interactive page (``--lang en|zh-TW``).
- ``<stem>_layers.gif`` with ``--gif``: the class-token map from layer 1 to L, animated.

A bad image gets one line on stderr naming it, the others are still written, and the exit code is 1.
Problems with the options themselves (model, device, output folder, an output that would overwrite an
input) get one line and exit code 2, before anything is written. Every file is written whole or not at
all (:mod:`attnviz.atomic`); Ctrl-C ends with one line and exit code 130.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

from . import atomic, capture, dataset_cli, export as exporting, faithfulness_cli, figure_cli, i18n, qk_cli, render, video_cli
from .command import UsageError, check_device, check_outputs, load_model_from, model_arguments, reads, run_command
from .images import ImageError
from .photos import load_photo

LARGE_EXPORT_BYTES = 100_000_000  # --format full over this per photo is said once, before the first photo


def safe_stem(path: str) -> str:
    """A file-name stem with no directories, dots-only names or odd characters (no path traversal)."""
    stem = re.sub(r"[^\w\-]+", "_", Path(path).stem, flags=re.ASCII).strip("_.")
    return stem or "image"


def outputs(out: Path, stem: str, args: argparse.Namespace) -> list[tuple[str, Path]]:
    """What :func:`export_one` writes for one photo: (what it is, where), in the order it is written."""
    files = [("capture", f"{stem}.npz"), ("overlay", f"{stem}_overlay.png")]
    if args.html:
        files.append(("interactive page", f"{stem}.html"))
    if args.gif:
        files.append(("layer sweep", f"{stem}_layers.gif"))
    return [(what, out / name) for what, name in files]


def export_one(model, path: Path, out: Path, stem: str, args: argparse.Namespace, weights: dict | None = None,
               source: str | None = None) -> None:
    from . import html, sweep
    from .rollout import cls_rollout_grid

    checked = load_photo(path, model)  # decoded exactly as the page decodes it; stat-checked before it is read
    cap = capture(model, checked.image, fit=args.fit)
    source = source or path.name  # what the files record: the file name, with its folder where two share it
    about = exporting.describe(model, cap, source=source, weights=weights, source_size=checked.image.size)
    # (h, w): CLS rollout, head mean, no discard, residual 0.5
    extra = {"rollout": cls_rollout_grid(cap)} if args.rollout else None
    files = dict(outputs(out, stem, args))
    # every file goes through a temporary file and an atomic rename: an interrupted run leaves no half file
    exporting.save_capture(files["capture"], cap, format=args.format, dtype=args.dtype, about=about,
                           labels=model.labels, extra=extra)
    view = model.view(checked.image, args.fit)
    with atomic.replacing(files["overlay"]) as f:
        render.overlay(view, html.summary_map(cap, cap.num_layers - 1, "mean")).save(f, format="PNG")
    if args.html:
        page = html.page(cap, args.lang, source=source, top=model.top_classes(cap.output), picture=view)
        atomic.write_text(files["interactive page"], page)
    if args.gif:
        atomic.write_bytes(files["layer sweep"], sweep.sweep_gif(cap, picture=view))


def tails(paths: list[str]) -> dict[str, str]:
    """Each path's shortest ending (``x/p.jpg``) that none of the other paths ends with: what tells files of
    one name apart without the rest of the path (exports are shared). The same path given twice is one."""
    full = {name: Path(os.path.abspath(name)).parts[1:] for name in paths}
    ends = {}
    for name, parts in full.items():
        others = {p for p in full.values() if p != parts}
        k = 1
        while k < len(parts) and any(p[-k:] == parts[-k:] for p in others):
            k += 1
        ends[name] = "/".join(parts[-k:])
    return ends


def plan(images: list[str]) -> list[tuple[str, str]]:
    """Each input with the stem of its outputs: inputs with the same stem from different folders get the end of
    their folder's path in front, as far as it tells them apart (``a/x.jpg``, ``b/x.jpg`` → ``a_x``, ``b_x``;
    ``a/x/p.jpg``, ``b/x/p.jpg`` → ``a_x_p``, ``b_x_p``); any still alike (``x.gif`` and ``x.webp`` in one folder)
    ``stem``, ``stem_``, …"""
    groups: dict[str, list[str]] = {}
    for name in images:
        groups.setdefault(safe_stem(name), []).append(name)
    named = {}
    for alike in groups.values():
        folders = {name: str(Path(name).parent) for name in alike}
        if len(alike) > 1 and len({os.path.abspath(f) for f in folders.values()}) == len(alike):
            ends = tails(list(folders.values()))  # each from its own folder: name the folders
            named |= {name: safe_stem(f"{ends[folders[name]]}_{Path(name).name}".replace("/", "_")) for name in alike}
    planned, used = [], set()
    for name in images:
        stem = named.get(name) or safe_stem(name)
        while stem in used:  # two inputs named alike must not overwrite each other
            stem += "_"
        used.add(stem)
        planned.append((name, stem))
    return planned


def recorded_names(images: list[str]) -> dict[str, str]:
    """What each input's files record as its source: its file name, or, where inputs share the name, the end
    of its path that tells it apart (:func:`tails`; never the rest of the path: exports are shared)."""
    groups: dict[str, list[str]] = {}
    for name in images:
        groups.setdefault(Path(name).name, []).append(name)
    return {name: (tails(alike)[name] if len(alike) > 1 else Path(name).name)
            for alike in groups.values() for name in alike}


def check_inputs_kept(planned: list[tuple[str, str]], out: Path, args: argparse.Namespace) -> None:
    """Refuse, before anything is written, an output path that is one of the inputs (photos, checkpoint)."""
    check_outputs(((f"{name}'s {what}", target) for name, stem in planned for what, target in outputs(out, stem, args)),
                  reads(args, *(name for name, _ in planned)),
                  "nothing was exported, so choose another --out folder or rename that file")


def output_folder(name: str, create: bool = True) -> Path:
    """``--out`` as an existing or new folder, or a one-line reason it cannot be one."""
    out = Path(name)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {name} is a file, not a folder; name a folder (it is created if missing).")
    if not create:
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the output folder {name}: {e.strerror or e}.") from None
    return out


def size_note(model, args: argparse.Namespace) -> str | None:
    """One line saying how large ``--format full`` makes each photo's file where that is over
    :data:`LARGE_EXPORT_BYTES` (a model with stages and windows: its matrices are mostly zeros), or None."""
    if args.format != "full":
        return None
    size = exporting.attention_bytes(model.layouts, args.dtype)
    if size <= LARGE_EXPORT_BYTES:
        return None
    return (f"note: --format full writes {size / 1e6:.0f} MB of attention weights per photo for {model.public_name} "
            "(every layer's N × N matrix); --format qk leaves them out and load_capture recomputes the same weights "
            "from the queries and keys.")


def export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.format == "qk" and args.dtype != "float32":
        raise UsageError("--dtype float16 applies to --format full only; the queries and keys stay float32 "
                         "(the logits reach ~300, where float16 would change the weights).")
    check_device(args.device)
    output_folder(args.out, create=False)  # a file in the way is said before the model loads
    planned = plan(args.images)
    check_inputs_kept(planned, Path(args.out), args)  # x_overlay.png among the inputs stays as it is
    model = load_model_from(args, "Nothing was exported.")
    out = output_folder(args.out)
    weights = exporting.weights_file(model, args.checkpoint)  # sha256 once, not per image
    note = size_note(model, args)
    if note is not None:
        print(note, file=sys.stderr)
    sources = recorded_names(args.images)
    failed, done = 0, 0
    try:
        for name, stem in tqdm(planned, unit="image", disable=len(planned) < 2 or args.quiet):
            path = Path(name)
            try:
                if not path.is_file():
                    raise ImageError(f"{name} is not a file." if path.exists() else
                                     f"{name} is a link to nothing (its target is missing, or it loops)."
                                     if path.is_symlink() else f"{name} does not exist.")
                export_one(model, path, out, stem, args, weights, sources[name])
            except (ImageError, OSError) as e:
                message = str(e) if isinstance(e, ImageError) else f"could not write {stem}'s files: {e.strerror or e}."
                tqdm.write(f"error: {message}", file=sys.stderr)
                failed += 1
            done += 1
    except KeyboardInterrupt:
        print(f"interrupted after {done} of {len(planned)} images; every file written is whole, none was left "
              "half-written.", file=sys.stderr)
        return 130
    return 1 if failed else 0


def app(options: list[str]) -> int:
    """``attnviz app``: the Streamlit page, model warmed first (:mod:`attnviz_app.launch`)."""
    missing = [name for name in ("streamlit", "streamlit_webrtc") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"attnviz app needs the web app's packages ({', '.join(missing)} missing): pip install 'attnviz[app]'",
              file=sys.stderr)
        return 2
    from attnviz_app import launch

    return launch.main(options)


# Each subcommand beside ``export`` and ``app`` is one module with ``add_parser(sub)`` and ``run(args)``
# (run through :func:`attnviz.command.run_command`: it may raise UsageError).
COMMANDS = {"dataset": dataset_cli, "faithfulness": faithfulness_cli, "qk": qk_cli, "figure": figure_cli,
            "video": video_cli}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnviz", description="See what a Vision Transformer attends to.")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser(
        "export", help="write every layer's and head's attention for images to .npz, .png (and .html, .gif)",
        description="Per image: <stem>.npz (read it back with attnviz.load_capture), <stem>_overlay.png, and "
        "with --html / --gif a self-contained interactive page and an animated layer sweep.",
    )
    ex.add_argument("images", nargs="+", help="image files")
    ex.add_argument("--out", required=True, help="output folder (created if missing)")
    model_arguments(ex, fit_help="non-square photos: resize and centre-crop (default, as timm does) or squash the "
                                 "whole photo")
    ex.add_argument("--format", choices=exporting.FORMATS, default="full",
                    help="full (default): also `attention` (L, H, N, N), 540 MB at 518 px in float32 and 298 MB for a "
                    "Swin-T at 224 px (said before the first photo when over 100 MB); qk: only the queries and keys "
                    "(51 MB at 518 px, 21 MB for the Swin-T), from which load_capture recomputes every weight")
    ex.add_argument("--dtype", choices=exporting.DTYPES, default="float32",
                    help="precision of `attention` in --format full (float16 halves the file; stated inside it)")
    ex.add_argument("--rollout", action="store_true",
                    help="also write `rollout`: the CLS attention rollout on the grid")
    ex.add_argument("--html", action="store_true",
                    help="also write <stem>.html: one self-contained interactive page (works offline; any patch can "
                    "be the query up to 224 px, larger inputs keep the class token's rows only)")
    ex.add_argument("--lang", choices=tuple(i18n.LANGUAGES), default=i18n.DEFAULT, help="language of the --html page")
    ex.add_argument("--gif", action="store_true",
                    help="also write <stem>_layers.gif: the class-token map from layer 1 to L, for slides")
    ex.add_argument("--quiet", action="store_true", help="no progress bar")
    for command in COMMANDS.values():
        command.add_parser(sub)
    sub.add_parser("app", help="serve the web page (needs pip install 'attnviz[app]'); Streamlit's options pass through, "
                   "e.g. attnviz app --server.port 8600", add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["app"]:
        return app(argv[1:])
    args = parser.parse_args(argv)
    # Ctrl-C while the model loads; past that, each command says how far it got
    if args.command in COMMANDS:
        return run_command(COMMANDS[args.command].run, args, "interrupted: nothing was written.")
    return run_command(export, args, "interrupted before any photo was exported.")
