"""``attnviz qk PHOTO… --layer L --head H --json OUT.json``: one head's queries and keys as 2-D points.

The JSON holds one record per point — ``kind`` (query / key), ``photo`` (its name), ``token`` (index in
the photo: prefix tokens first, then the patches in raster order), ``x``, ``y`` — and the map's measured
statistics (:mod:`attnviz.qkmap`). ``--run RUNDIR`` reads the stored captures of an ``attnviz dataset
--store qk`` run instead of photos. Layer and head count from 1, as on the page.

Problems are one line on stderr: exit code 2 for options that cannot work (a layer or head out of range,
UMAP / t-SNE not installed, a run without stored captures, a model that cannot be loaded), 1 for a photo
that cannot be used (nothing is written then).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import atomic, qkmap
from .command import UsageError, check_outputs, load_model_from, model_arguments, reads, say


def add_parser(sub: argparse._SubParsersAction) -> None:
    qk = sub.add_parser(
        "qk", help="one head's queries and keys as 2-D points (AttentionViz's Q/K map), as JSON",
        description="Every token's query and key of one head, of one or more photos (or a dataset run's stored "
                    "captures), projected to 2-D; one JSON record per point.",
    )
    qk.add_argument("photos", nargs="*", help="photo files (or use --run)")
    qk.add_argument("--run", default=None, help="a run folder of attnviz dataset --store qk, instead of photos")
    qk.add_argument("--layer", type=int, required=True, help="layer, counted from 1")
    qk.add_argument("--head", type=int, required=True, help="head, counted from 1")
    qk.add_argument("--method", choices=qkmap.METHODS, default="pca",
                    help="pca (default, exact), umap (needs umap-learn) or tsne (needs scikit-learn)")
    qk.add_argument("--normalize", choices=qkmap.NORMALIZATIONS, default="attentionviz",
                    help="attentionviz (default): keys translated and both scaled as in AttentionViz, which leaves "
                         "softmax(q·kᵀ) unchanged; none: the capture's own q and k")
    qk.add_argument("--json", required=True, dest="json_out", help="output file")
    model_arguments(qk, device=False)


def run(args: argparse.Namespace) -> int:
    from .errors import AttnvizError, ImageError, RunError

    if bool(args.photos) == bool(args.run):
        raise UsageError("give photos or --run RUNDIR (one of the two).")
    if args.method != "pca" and not qkmap.available(args.method):
        raise UsageError(qkmap.missing_message(args.method))
    if args.run is None and len(args.photos) > qkmap.MAX_PHOTOS:
        raise UsageError(f"a Q/K map takes at most {qkmap.MAX_PHOTOS} photos, not {len(args.photos)}.")
    if Path(args.json_out).is_dir():
        raise UsageError(f"--json {args.json_out} is a folder; name a file.")
    check_outputs([(f"--json {args.json_out}", args.json_out)], reads(args, *args.photos, args.run))
    if args.run is not None:
        try:
            caps, names = qkmap.run_captures(args.run)
        except (RunError, AttnvizError, OSError) as e:
            return say(e, 2)
    else:
        from . import capture
        from .photos import load_photo

        model = load_model_from(args)
        caps, names = [], []
        for name in args.photos:
            try:
                caps.append(capture(model, load_photo(name, model).image, fit=args.fit))
            except (ImageError, OSError) as e:
                return say(e if isinstance(e, ImageError) else f"cannot read {name}: {e.strerror or e}.", 1)
            names.append(name)
    layers, heads = caps[0].num_layers, caps[0].num_heads
    if not 1 <= args.layer <= layers:
        raise UsageError(f"--layer must be 1…{layers}, not {args.layer}.")
    if not 1 <= args.head <= heads:
        raise UsageError(f"--head must be 1…{heads}, not {args.head}.")
    qk = qkmap.qk_map(caps, args.layer - 1, args.head - 1, args.method, args.normalize)
    stats = qkmap.statistics(qk)
    points = qk.records()
    for point in points:
        point["photo"] = names[point["photo"]]
    document = {
        "layer": args.layer, "head": args.head, "method": args.method, "normalize": args.normalize,
        "photos": names, "grid": list(qk.grid), "num_prefix_tokens": qk.num_prefix_tokens,
        "statistics": {"distance_spearman": stats.distance_rho, "row_r": stats.row_r,
                       "column_r": stats.column_r, "pairs": stats.pairs},
        "points": points,
    }
    try:
        atomic.write_text(args.json_out, json.dumps(document))
    except OSError as e:
        return say(f"cannot write {args.json_out}: {e.strerror or e}.", 2)
    print(f"{len(points)} points of layer {args.layer}, head {args.head} ({len(names)} photos, {args.method}) "
          f"in {args.json_out}; q·k vs 2-D distance: Spearman {stats.distance_rho:+.2f}")
    return 0
