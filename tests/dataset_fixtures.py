"""A small folder of photos made by the tests: sample photos, generated pictures and a bad file."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnviz import dataset
from conftest import ASSETS

# The offline model at 56 px (4 × 4 patches, N = 17): the real weights and code path, ~20× cheaper than 196 px.
SMALL = 56


def photo_folder(root: Path) -> Path:
    """root/photos: 2 sample photos, a generated PNG and WebP in a subfolder, and a text file named .jpg."""
    folder = root / "photos"
    (folder / "more").mkdir(parents=True)
    shutil.copy(ASSETS / "cat.jpg", folder / "cat.jpg")
    shutil.copy(ASSETS / "rocket.jpg", folder / "rocket.jpg")
    rng = np.random.default_rng(0)
    rows, cols = np.mgrid[0:90, 0:160]
    gradient = np.stack([rows * 2.8, cols * 1.6, (rows + cols) % 256], -1).astype(np.uint8)
    Image.fromarray(gradient).save(folder / "more" / "gradient.png")
    Image.fromarray(rng.integers(0, 256, (120, 100, 3), dtype=np.uint8)).save(folder / "more" / "noise.webp")
    (folder / "notes.jpg").write_text("not a picture")
    (folder / "readme.txt").write_text("not listed: no image suffix")
    return folder


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Thousands of tiny tensor ops: on a busy 2-core machine two OpenMP threads wait on each other
    # (measured 18.9 s vs 0.6 s for four photos under load). The numbers do not depend on it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def same_tables(a: dataset.Tables, b: dataset.Tables, tol: float = 1e-5) -> None:
    for name in dataset.TABLES:
        x, y = getattr(a, name).to_pandas(), getattr(b, name).to_pandas()
        assert list(x.columns) == list(y.columns) and len(x) == len(y), name
        for column in x.columns.drop("seconds", errors="ignore"):  # wall time differs from run to run
            if x[column].dtype.kind == "f":
                assert np.allclose(x[column], y[column], atol=tol, rtol=0, equal_nan=True), (name, column)
            else:
                assert x[column].astype(str).tolist() == y[column].astype(str).tolist(), (name, column)
