"""``attnviz figure PHOTO --out FIG``: a composed figure of a photo's attention, as SVG, PDF or PNG.

Layers and heads are counted from 1 here, as on the page (``--heads mean,1,2``). Any option that cannot
work gets one line on stderr and exit code 2 before the model loads; a photo that cannot be read gets
one line and exit code 1. The file is written whole or not at all (:mod:`attnviz.atomic`).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from . import i18n
from .command import check_outputs, load_model_from, model_arguments, reads, say
from .errors import AttnvizError, ImageError
from .figure import FORMATS, VIEWS, FigureError


def add_parser(sub: argparse._SubParsersAction) -> None:
    fig = sub.add_parser(
        "figure", help="a figure for papers and slides: the photo beside chosen layers' and heads' maps (SVG, PDF, PNG)",
        description="The photo as the model saw it, then the class token's map of every chosen layer × head, the "
                    "attention rollout and every head of the chosen layers, each with its colour bar, in one vector file.",
    )
    fig.add_argument("photo", help="an image file")
    fig.add_argument("--out", required=True, help="the figure's file (its suffix gives the format unless --format does)")
    fig.add_argument("--layers", default=None, help="layers, counted from 1, e.g. 1,6,12 (default: the last)")
    fig.add_argument("--heads", default="mean", help="heads, counted from 1, or mean / max / min, e.g. mean,1,2 (default mean)")
    fig.add_argument("--views", default="cls", help=f"some of {','.join(VIEWS)} (default cls)")
    fig.add_argument("--format", choices=FORMATS, default=None, help="svg, pdf or png (default: from --out's suffix)")
    fig.add_argument("--dpi", type=int, default=300, help="dots per inch of the raster parts and of a PNG (default 300)")
    fig.add_argument("--lang", choices=tuple(i18n.LANGUAGES), default=i18n.DEFAULT, help="language of the titles")
    fig.add_argument("--cmap", default="inferno", help="matplotlib colour map (default inferno)")
    fig.add_argument("--alpha", type=float, default=0.6, help="heatmap opacity over the photo, 0…1 (default 0.6)")
    model_arguments(fig)


def _numbers(text: str | None, what: str, words: tuple[str, ...] = ()) -> list:
    """``"mean,1,2"`` → ``["mean", 0, 1]`` (0-based), or a FigureError naming the bad item."""
    if text is None:
        return []
    items = []
    for item in (part.strip() for part in text.split(",")):
        if item in words:
            items.append(item)
        elif item.isdigit() and int(item) >= 1:
            items.append(int(item) - 1)
        else:
            extra = f", or {' / '.join(words)}" if words else ""
            raise FigureError(f"--{what} takes numbers from 1{extra}, separated by commas, not {item!r}.")
    return items


def run(args: argparse.Namespace) -> int:
    from . import capture, figure
    from .photos import load_photo

    try:
        layers = _numbers(args.layers, "layers")
        heads = _numbers(args.heads, "heads", ("mean", "max", "min"))
        views = [v.strip() for v in args.views.split(",")]
        if any(v not in VIEWS for v in views):
            raise FigureError(f"--views takes some of {', '.join(VIEWS)}, not {args.views!r}.")
        fmt = args.format or Path(args.out).suffix.lstrip(".").lower()
        if fmt not in FORMATS:
            raise FigureError(f"say --format svg, pdf or png, or give --out one of those suffixes ({args.out} has none).")
        if not 10 <= args.dpi <= 1200:
            raise FigureError(f"--dpi must be from 10 to 1200, not {args.dpi}.")
        if not 0.0 <= args.alpha <= 1.0:
            raise FigureError(f"--alpha must be from 0 to 1, not {args.alpha}.")
        if Path(args.out).is_dir():
            raise FigureError(f"--out {args.out} is a folder; name the figure's file, e.g. {Path(args.out) / 'figure.pdf'}.")
        if not Path(args.out).parent.is_dir():
            raise FigureError(f"the folder of --out {args.out} does not exist.")
        check_outputs([(f"--out {args.out}", args.out)], reads(args, args.photo), "nothing was written, so "
                      "choose another file name")
        model = load_model_from(args)
        layers = layers or [model.depth - 1]
        if max(layers) >= model.depth:
            raise FigureError(f"--layers {max(layers) + 1}: {model.public_name} has {model.depth} layers (1…{model.depth}).")
        numbered = [h for h in heads if isinstance(h, int)]
        if numbered and max(numbered) >= model.num_heads:
            raise FigureError(f"--heads {max(numbered) + 1}: {model.public_name} has {model.num_heads} heads per layer "
                              f"(1…{model.num_heads}, or mean / max / min).")
    except FigureError as e:
        return say(e, 2)
    try:
        checked = load_photo(args.photo, model)  # decoded exactly as the page decodes it
        cap = capture(model, checked.image, fit=args.fit)
        fig = figure.compose(cap, layers, heads, views, picture=model.view(checked.image, args.fit), cmap=args.cmap,
                             alpha=args.alpha, lang=args.lang, model=model.public_name)
        figure.save(fig, args.out, format=fmt, dpi=args.dpi)
    except FigureError as e:
        return say(e, 2)
    except (ImageError, AttnvizError) as e:
        return say(e, 1)
    except OSError as e:
        return say(f"could not write {args.out}: {e.strerror or e}.", 1)
    print(f"wrote {args.out}")
    return 0
