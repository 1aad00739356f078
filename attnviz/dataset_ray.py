"""The ``ray`` engine: the same per-batch function as the local engine, scheduled by Ray Data.

    read_binary_files(paths) → map_batches(Analyser, actor pool: one model per actor) → records
                             → the driver appends each batch to the run folder's Parquet tables

Each actor loads the model once in ``__init__`` and then calls :func:`attnviz.dataset.analyse` on
every batch it is given (Ray Data's pattern for model inference). The records are small (~6 KB per
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

from .dataset import RunConfig, RunFolder, Summary, analyse, list_images, missing_errors, saver

class Analyser:
    """A Ray actor: one model, loaded once; called with batches of ``path`` / ``bytes`` columns."""

    def __init__(self, config: RunConfig, captures: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.config = config
        self.model = config.load()
        self.save = saver(config.store, self.model, config.checkpoint)
        self.captures = Path(captures)

    def __call__(self, batch: pa.Table) -> pa.Table:
        items = zip(batch["path"].to_pylist(), batch["bytes"].to_pylist())
        return analyse(self.model, list(items), self.config.fit, self.save, self.captures)


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
    folder.start(config, config.load().name)  # also a one-line error for a bad --model before Ray starts
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
        present = [p for p in pending if os.path.isfile(p)]  # Ray refuses a list with no file at all
        if present:
            quiet()
            # Reading is light I/O: num_cpus=0 lets it run beside actors that hold every CPU.
            files = ray.data.read_binary_files(present, include_paths=True, ignore_missing_paths=True, num_cpus=0)
            records = files.map_batches(
                Analyser, fn_constructor_args=(config, str(folder.captures), cpus_per_worker),
                batch_size=batch, batch_format="pyarrow", num_cpus=cpus_per_worker,
                compute=ray.data.ActorPoolStrategy(size=workers),
            )
            with tqdm(total=len(present), unit="image", disable=not progress) as bar:
                for part in records.iter_batches(batch_size=None, batch_format="pyarrow"):
                    tables = folder.write(part)
                    images, errors = images + tables.images.num_rows, errors + tables.errors.num_rows
                    first = first if seen else (time.perf_counter() - start, len(tables))
                    seen.update(part["path"].to_pylist())
                    bar.update(part.num_rows)
        lost = [p for p in pending if p not in seen]  # vanished or unreadable before Ray could read them
        if lost:
            errors += folder.write(missing_errors(lost)).errors.num_rows
    finally:
        if owned:
            ray.shutdown()
    return Summary(len(paths), len(paths) - len(pending), images, errors, time.perf_counter() - start, *first)
