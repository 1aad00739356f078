"""The ray engine gives the local engine's tables, resumes, and keeps Ray's start-up cost to one small cluster."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from attnviz.dataset import RunConfig, read_run, run_local

from dataset_fixtures import SMALL, one_thread, photo_folder, same_tables  # noqa: F401 (autouse fixture)

ray = pytest.importorskip("ray", reason="the ray extra is not installed (make setup installs it)")
from attnviz import dataset_ray  # noqa: E402

CONFIG = RunConfig(size=SMALL)


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for this module: 2 CPUs, no dashboard, shut down afterwards."""
    dataset_ray.start_local(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("ray"))


def test_both_engines_give_equal_tables(cluster, folder, tmp_path):
    local = run_local(folder, tmp_path / "local", CONFIG, batch=4, progress=False)
    on_ray = dataset_ray.run_ray(folder, tmp_path / "ray", CONFIG, batch=2, workers=1, cpus_per_worker=1,
                                    progress=False)
    assert (on_ray.images, on_ray.errors) == (local.images, local.errors) == (4, 1)
    a, b = read_run(tmp_path / "local"), read_run(tmp_path / "ray")
    same_tables(a, b, tol=1e-5)
    assert np.abs(a.heads["entropy"].to_numpy() - b.heads["entropy"].to_numpy()).max() <= 1e-5
    assert b.errors.to_pylist()[0]["error_key"] == "unreadable"

    # A rerun on Ray skips everything; a file that vanished gets an errors row instead of being lost.
    listing = tmp_path / "list.txt"
    listing.write_text(f"{folder / 'cat.jpg'}\n{folder / 'gone.png'}\n")
    again = dataset_ray.run_ray(listing, tmp_path / "ray", CONFIG, batch=2, cpus_per_worker=1, progress=False)
    assert (again.skipped, again.images, again.errors) == (1, 0, 1)
    gone = read_run(tmp_path / "ray").errors.to_pylist()
    assert [row["error_key"] for row in gone] == ["file_missing", "unreadable"]
    assert gone[0]["path"].endswith("gone.png")


def test_both_engines_read_the_same_file_names_and_refuse_the_same_files(cluster, folder, tmp_path):
    """A newline in a name (Ray's own file reader could not open it), a FIFO (it would block a reader)."""
    odd = tmp_path / "odd"
    odd.mkdir()
    shutil.copy(folder / "cat.jpg", odd / "new\nline.jpg")
    shutil.copy(folder / "more" / "gradient.png", odd / "spaces, ünïcode & #1.png")
    os.mkfifo(odd / "pipe.jpg")
    local = run_local(odd, tmp_path / "local", CONFIG, progress=False)
    on_ray = dataset_ray.run_ray(odd, tmp_path / "ray", CONFIG, batch=2, cpus_per_worker=1, progress=False)
    assert (on_ray.images, on_ray.errors) == (local.images, local.errors) == (2, 1)
    a, b = read_run(tmp_path / "local"), read_run(tmp_path / "ray")
    same_tables(a, b, tol=1e-5)
    assert str(odd / "new\nline.jpg") in b.images["path"].to_pylist()
    assert b.errors.to_pylist()[0]["error_key"] == "file_not_regular"
