"""``attnviz video IN --out OUT.mp4``: the class token's heatmap over every frame of a video, as H.264 MP4.

Layer and head count from 1 here, as on the page. Options that cannot work get one line and exit code 2
before the model loads; a video that cannot be used (not a video, damaged, over a limit) gets one line
and exit code 1, and no output file. Ctrl-C: one line, exit code 130, no output file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import i18n
from .command import UsageError, check_outputs, load_model_from, model_arguments, say


def add_parser(sub: argparse._SubParsersAction) -> None:
    vid = sub.add_parser(
        "video", help="a video with the class token's attention over every frame (MP4, H.264)",
        description="Each (sampled) frame goes through the same capture as a photo; the result is the model's "
                    "view of the frame with the chosen layer's and head's heatmap. Limits (60 s, 4K, 500 MB, 7200 "
                    "frames, 3600 frames drawn) are checked from the file's header before any frame is decoded, "
                    "and again on every packet read and every frame decoded.",
    )
    vid.add_argument("video", help="a video file (MP4, MOV, WebM, …; phone rotation is respected)")
    vid.add_argument("--out", required=True, help="the result, an .mp4 file")
    vid.add_argument("--layer", type=int, default=None, help="layer, counted from 1 (default: the last)")
    vid.add_argument("--head", default="mean", help="head, counted from 1, or mean / max / min (default mean)")
    vid.add_argument("--fps", type=float, default=None,
                     help="frames per second of the result: every n-th frame is used (default: the video's, at most 30)")
    vid.add_argument("--scale", type=int, default=2, help="each model pixel becomes scale × scale pixels (default 2)")
    vid.add_argument("--alpha", type=float, default=0.6, help="heatmap opacity, 0…1 (default 0.6)")
    vid.add_argument("--cmap", default="inferno", help="matplotlib colour map (default inferno)")
    model_arguments(vid, fit_help="non-square frames: crop (default) or squash")
    vid.add_argument("--lang", choices=tuple(i18n.LANGUAGES), default=i18n.DEFAULT, help="language of the summary line")
    vid.add_argument("--quiet", action="store_true", help="no progress bar")


def _head(text: str):
    if text in ("mean", "max", "min"):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text) - 1
    raise ValueError(f"--head takes a number from 1, or mean / max / min, not {text!r}.")


def run(args: argparse.Namespace) -> int:
    import matplotlib

    from .errors import AttnvizError
    from .video import VideoError, VideoSettings, describe, render_video

    try:
        import av  # noqa: F401
    except ImportError:
        return say("attnviz video needs PyAV: pip install 'attnviz[video]'", 2)
    try:
        head = _head(args.head)
        if args.layer is not None and args.layer < 1:
            raise ValueError(f"--layer counts from 1, not {args.layer}.")
        if args.fps is not None and not 0 < args.fps <= 240:
            raise ValueError(f"--fps must be above 0 and at most 240, not {args.fps}.")
        if not 1 <= args.scale <= 8:
            raise ValueError(f"--scale must be from 1 to 8, not {args.scale}.")
        if not 0.0 <= args.alpha <= 1.0:
            raise ValueError(f"--alpha must be from 0 to 1, not {args.alpha}.")
        if args.cmap not in matplotlib.colormaps:
            raise ValueError(f"--cmap {args.cmap} is not a matplotlib colour map.")
        out = Path(args.out)
        if out.suffix.lower() != ".mp4":
            raise ValueError(f"--out must name an .mp4 file, not {args.out}.")
        if out.is_dir() or not out.parent.is_dir():
            raise ValueError(f"--out {args.out} must be a file in an existing folder.")
        check_outputs([(f"--out {args.out}", out)], [args.video, args.checkpoint], "nothing was written, so choose "
                      "another file name")
        model = load_model_from(args)
        if args.layer is not None and args.layer > model.depth:
            raise ValueError(f"--layer {args.layer}: {model.public_name} has {model.depth} layers.")
        if isinstance(head, int) and head >= model.num_heads:
            raise ValueError(f"--head {head + 1}: {model.public_name} has {model.num_heads} heads per layer.")
    except (ValueError, UsageError) as e:
        return say(e, 2)
    settings = VideoSettings(layer=None if args.layer is None else args.layer - 1, head=head, alpha=args.alpha,
                             cmap=args.cmap, fit=args.fit, fps=args.fps, scale=args.scale)
    from tqdm import tqdm

    bar = tqdm(unit="frame", disable=args.quiet, desc=Path(args.video).name)

    def progress(done: int, total: int | None) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        result = render_video(args.video, out, model, settings, progress=progress)
    except (VideoError, AttnvizError) as e:
        bar.close()
        return say(e, 1)
    except OSError as e:
        bar.close()
        return say(f"could not write {args.out}: {e.strerror or e}.", 1)
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted: {args.out} was not written (no partial file is left).", file=sys.stderr)
        return 130
    bar.close()
    note = describe(result.source, model, model.depth - 1 if settings.layer is None else settings.layer, head,
                    result.every, result.fps, args.lang)
    print(f"{note}\nwrote {args.out}: {result.frames_out} frames of {result.frames_in}, "
          f"{result.frames_out / result.fps:.2f} s, {result.frames_per_second:.1f} frames/s")
    return 0
