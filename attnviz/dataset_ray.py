"""The ``ray`` engine: the same per-batch function as the local engine, scheduled by Ray Data.

    from_items(paths) → map_batches(Analyser, actor pool: one model per actor) → records
                      → the driver appends each batch to the run folder's Parquet tables

Each actor loads the model once in ``__init__`` and then, for every batch of paths it is given, reads
the files with :func:`attnviz.dataset.read_items` and calls :func:`attnviz.dataset.analyse` (Ray Data's
pattern for model inference). The files are read the way the local engine reads them — any name a
file system allows (a newline in it too), ``stat``-checked before a byte is read, FIFOs and devices
refused with a reason row — rather than by Ray's own file reader. The records are small (~6 KB per
image for ViT-S: 72 heads × 7 numbers), so the driver streams them into the same part files the
local engine writes: a Ray run resumes batch by batch like a local one, and both give the same
tables. ``--store qk`` captures are written by the actors themselves, so on a cluster ``OUT`` must be
a folder every node sees (a shared file system).

Ray is an optional extra (``pip install attnviz[ray]``); nothing here is imported without it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa

from .dataset import RunConfig, RunFolder, Summary, analyse, list_images, missing_errors, read_items, saver


class Analyser:
    """A Ray actor: one model, loaded once; called with batches of a ``path`` column."""

    def __init__(self, config: RunConfig, captures: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.config = config
        self.model = config.load()
        self.save = saver(config.store, self.model, config.checkpoint)
        self.captures = Path(captures)

    def __call__(self, batch: pa.Table) -> pa.Table:
        items = read_items(batch["path"].to_pylist())
        return analyse(self.model, items, self.config.fit, self.save, self.captures)


def start_local(num_cpus: int | None = None) -> None:
    """Start a small Ray cluster in this process (no dashboard) whose workers can import attnviz."""
    import ray

    ray.init(
        num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False,
    )


def quiet() -> None:
    """Our own progress bar only: no Ray Data progress bars or per-stage log lines."""
    import logging

    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def run_ray(
    source: str | Path,
    out: str | Path,
    config: RunConfig = RunConfig(),
    batch: int = 4,
    workers: int = 1,
    cpus_per_worker: int | None = None,
    address: str | None = None,
    progress: bool = True,
) -> Summary:
    """Analyse every photo of ``source`` not yet done in ``out`` on Ray: ``workers`` actors, one model each.

    Joins the cluster at ``address`` (e.g. ``ray://head:10001`` or ``auto``), or uses the one this
    process already started, or starts a local one and shuts it down afterwards.
    """
    import ray
    from tqdm import tqdm

    start = time.perf_counter()
    paths = list_images(source)
    folder = RunFolder(Path(out))
    folder.check(config)
    folder.start(config, config.load().public_name)  # also a one-line error for a bad --model before Ray starts
    done = folder.done()
    pending = [p for p in paths if p not in done]
    if cpus_per_worker is None:
        cpus_per_worker = 1 if address else max(1, (os.cpu_count() or 1) // workers)
    owned = not ray.is_initialized()
    if owned:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            start_local()
    images = errors = 0
    first: tuple[float, int] = (0.0, 0)
    seen: set[str] = set()
    try:
        if pending:
            quiet()
            # one block per batch, so that the actors share them out
            names = ray.data.from_arrow([pa.table({"path": pa.array(pending[i : i + batch], pa.string())})
                                         for i in range(0, len(pending), batch)])
            records = names.map_batches(
                Analyser, fn_constructor_args=(config, str(folder.captures), cpus_per_worker),
                batch_size=batch, batch_format="pyarrow", num_cpus=cpus_per_worker,
                compute=ray.data.ActorPoolStrategy(size=workers),
            )
            with tqdm(total=len(pending), unit="image", disable=not progress) as bar:
                for part in records.iter_batches(batch_size=None, batch_format="pyarrow"):
                    tables = folder.write(part)
                    images, errors = images + tables.images.num_rows, errors + tables.errors.num_rows
                    first = first if seen else (time.perf_counter() - start, len(tables))
                    seen.update(part["path"].to_pylist())
                    bar.update(part.num_rows)
        lost = [p for p in pending if p not in seen]  # a batch Ray never gave back
        if lost:
            errors += folder.write(missing_errors(lost)).errors.num_rows
    finally:
        if owned:
            ray.shutdown()
    return Summary(len(paths), len(paths) - len(pending), images, errors, time.perf_counter() - start, *first)
