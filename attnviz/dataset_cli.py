"""``attnviz dataset DIR --out OUT``: attention statistics over a folder of photos, in Parquet.

See :mod:`attnviz.dataset` for what the run folder holds and :mod:`attnviz.dataset_ray` for the Ray engine.

Every problem is one line on stderr: exit code 2 for arguments that cannot work (a missing source, a
list file that is not UTF-8 text, ``--out`` naming a file, a run folder with other settings or a
damaged ``run.json``, a model that cannot be loaded), 1 when some files were unusable (each has its
errors row), 130 after Ctrl-C (what was written is kept, and the same command continues it).
"""
from __future__ import annotations

import argparse
import sys

from .command import UsageError, model_arguments, say
from .dataset import RunConfig, RunError, Summary, run_local
from .models import ModelError
from .runtimes import RUNTIMES, fast


def add_parser(sub: argparse._SubParsersAction) -> None:
    ds = sub.add_parser(
        "dataset", help="per-head attention statistics for a whole folder of photos, as Parquet tables",
        description="One row per (image, layer, head) in OUT/heads (with stages, each layer's own heads, "
                    "and the grid its most-attended patch lies on), one per image in OUT/images, one per "
                    "unusable file in OUT/errors. A rerun into the same OUT skips what is done.",
    )
    ds.add_argument("source", help="a folder of photos (searched recursively) or a text file listing one path a line")
    ds.add_argument("--out", required=True, help="run folder for the Parquet tables")
    ds.add_argument("--engine", choices=("local", "ray"), default="local", help="local (default) or ray")
    ds.add_argument("--address", default=None, help="Ray cluster to join (e.g. auto or ray://head:10001); "
                                                    "default: start a local one")
    ds.add_argument("--batch", type=int, default=4, help="images per batch: one part file (and one Ray task) each (default 4)")
    ds.add_argument("--workers", type=int, default=1, help="Ray actors, each holding one model (default 1)")
    ds.add_argument("--cpus-per-worker", type=int, default=None,
                    help="CPUs (and torch threads) per Ray actor (default: all local CPUs shared out; 1 on a cluster)")
    model_arguments(ds, device=False)
    ds.add_argument("--store", choices=("none", "qk"), default="none",
                    help="qk: also keep each image's exact compact capture (OUT/captures/<sha256>.npz, "
                         "reload with attnviz.load_capture)")
    ds.add_argument("--runtime", choices=sorted(RUNTIMES), default=None,
                    help="capture on this CPU runtime where it is checked exact for the model, else on PyTorch "
                         "(needs pip install 'attnviz[fast]'; local engine)")
    ds.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.batch < 1 or args.workers < 1:
        raise UsageError("--batch and --workers must be at least 1")
    if args.runtime and args.engine == "ray":
        raise UsageError("--runtime works with the local engine only")
    config = RunConfig(model=args.model, size=args.size, checkpoint=args.checkpoint, fit=args.fit, store=args.store)
    try:
        if args.engine == "ray":
            try:
                from .dataset_ray import run_ray
            except ImportError:
                return say("the ray engine needs Ray: pip install 'attnviz[ray]'", 2)
            summary = run_ray(args.source, args.out, config, batch=args.batch, workers=args.workers,
                              cpus_per_worker=args.cpus_per_worker, address=args.address, progress=not args.quiet)
        else:
            # a runtime is not a setting of the run (run.json): it is switched on only where its numbers are PyTorch's
            model = fast(config.load(), args.runtime) if args.runtime else None
            summary = run_local(args.source, args.out, config, batch=args.batch, progress=not args.quiet, model=model)
    except (ModelError, RunError) as e:
        return say(e, 2)
    except OSError as e:  # the run folder could not be written (a full disk, no permission)
        where = f" ({e.filename})" if e.filename else ""
        return say(f"cannot write the run's tables in {args.out}: {e.strerror or e}{where}.", 2)
    except KeyboardInterrupt:
        print(f"interrupted: the batches already written to {args.out} are kept; run the same command "
              "again to continue.", file=sys.stderr)
        return 130
    print(report(summary, args.out))
    return 1 if summary.errors else 0


def report(summary: Summary, out: str) -> str:
    done = f", {summary.skipped} already done" if summary.skipped else ""
    return (f"{summary.images} images and {summary.errors} unusable files in {summary.seconds:.1f} s "
            f"({summary.images_per_second:.2f} files/s){done}; tables in {out}")
