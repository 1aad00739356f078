"""``attnviz faithfulness PHOTO --json OUT.json``: does each map point at what the model relies on?

Writes, for one photo, every map's deletion and insertion curve and both areas
(:mod:`attnviz.faithfulness`), and with ``--ablation`` the L × H head-ablation effects
(:mod:`attnviz.ablation`)::

    {"fill": "token", "measure": "cosine",
     "maps": [{"name": "attention, layer 12, mean of heads", "order": [...], "removed": [0, 19, ...],
               "deletion": [...], "insertion": [...], "deletion_area": 0.67, "insertion_area": 0.83}, ...],
     "ablation": [[one effect per head] for each layer]}

Layers and heads are counted from 1 in names, as on the page; ``order`` lists patch indices in raster
order, most important first. One line on stderr for every problem: exit code 2 for options that
cannot work (a model that cannot load, a fill this model cannot take, --json naming the photo), 1 for
a photo that cannot be used, 130 after Ctrl-C (nothing half-written).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from . import atomic
from .command import UsageError, check_outputs, load_model_from, model_arguments, reads, say
from .errors import FaithfulnessError, ImageError


def finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def add_parser(sub: argparse._SubParsersAction) -> None:
    fa = sub.add_parser(
        "faithfulness", help="deletion / insertion curves of every map on one photo (and head ablation), as JSON",
        description="Rank the patches by each map, remove them 10 % at a time (deletion) or put them back "
                    "(insertion), and follow the model's output; with --ablation also switch off each head.",
    )
    fa.add_argument("photo", help="an image file")
    fa.add_argument("--json", required=True, dest="json_out", help="where to write the results (OUT.json)")
    model_arguments(fa)
    fa.add_argument("--fill", choices=("token", "mean", "blur"), default="token",
                    help="how a patch is removed: token (drop its token, default), mean (the photo's mean colour), blur")
    fa.add_argument("--heads", action="store_true", help="also rank by every head's own map, not only the mean of heads")
    fa.add_argument("--random", type=int, default=5, help="random orders to compare against (default 5, at least 2)")
    fa.add_argument("--ablation", action="store_true", help="also switch off each head alone: the L × H effects")
    fa.add_argument("--quiet", action="store_true", help="no summary line")


def run(args: argparse.Namespace) -> int:
    from . import ablation
    from .capture import capture
    from .faithfulness import faithfulness, sentence
    from .photos import load_photo

    if args.random < 2:
        raise UsageError("--random must be at least 2: the spread of random orders needs two of them.")
    photo, out = Path(args.photo), Path(args.json_out)
    if out.is_dir():
        raise UsageError(f"--json {args.json_out} is a folder; name a file.")
    check_outputs([(f"--json {args.json_out}", out)], reads(args, photo))
    model = load_model_from(args, "Nothing was written.")
    try:
        start = time.perf_counter()
        if not photo.is_file():
            raise ImageError(f"{args.photo} is not a file." if photo.exists() else f"{args.photo} does not exist.")
        cap = capture(model, load_photo(photo, model).image, fit=args.fit)
        result = faithfulness(model, cap, fill=args.fill, heads=args.heads, random_orders=args.random)
        record = {"photo": photo.name, "model": model.public_name, "size": model.size, **result.to_json()}
        if args.ablation:
            grid = ablation.head_ablation(model, cap)
            record |= {"ablation": grid.to_json(), "ablation_measure": grid.measure,
                       "head_entropy": ablation.per_layer(grid.entropy),
                       "head_top_share": ablation.per_layer(grid.top_share),
                       "rank_correlation": {  # null when every head has the same effect or statistic
                           "entropy": finite(grid.entropy_correlation), "top_share": finite(grid.share_correlation)}}
        record["sentence"] = sentence(result)
        atomic.write_text(out, json.dumps(record, indent=1, allow_nan=False))
    except FaithfulnessError as e:
        return say(e, 2)
    except ImageError as e:
        return say(e, 1)
    except OSError as e:
        return say(f"cannot write {args.json_out}: {e.strerror or e}.", 2)
    except KeyboardInterrupt:
        print(f"interrupted: {args.json_out} was not written.", file=sys.stderr)
        return 130
    if not args.quiet:
        print(f"{len(result.curves)} maps and {len(result.random)} random orders"
              f"{' and the head-ablation grid' if args.ablation else ''} in {time.perf_counter() - start:.1f} s "
              f"→ {args.json_out}\n{record['sentence']}")
    return 0
