"""A class at once (slow): thirty sessions each upload their own 12-megapixel phone photo within ~5 s,
against one server started as `make run` starts it; each must get its own heatmap.

The timings are printed, not asserted (the benchmark, `python -m bench.classroom`, holds the targets);
what is asserted is that every student sees the heatmap of their own photo, that no page shows an error,
and that the server's memory stays well under what it was before (2.25 GB).
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import render
from serve import chromium, require_chromium, streamlit_server

from bench.classroom import HEATMAP, LAUNCHER, phone_jpeg, run_class

SESSIONS = 30
# A guard, not the target (≤ 1.5 GB, measured by bench.classroom): 2.25 GB before issue #10, ~1.55 GB now,
# of which 1.22 GB is a fresh server.
MEMORY_LIMIT = 1.9 * 2**30


def expected(model: attnviz.Model, data: bytes) -> np.ndarray:
    """The page's default picture for ``data`` (last layer, mean of heads), from the library."""
    image = attnviz.read_photo(data, model).image
    cap = attnviz.capture(model, image)
    picture = render.overlay(model.view(image), cap.cls_map(cap.num_layers - 1, "mean"))
    return np.asarray(picture, dtype=np.float32)


def shown(page, url: str, size: int) -> np.ndarray:
    src = page.locator(HEATMAP).first.get_attribute("src")
    body = page.context.request.get(src if src.startswith(("http", "data:")) else url + src).body()
    picture = Image.open(io.BytesIO(body)).convert("RGB")
    return np.asarray(picture.resize((size, size), Image.Resampling.BOX), dtype=np.float32)


@pytest.mark.slow
@pytest.mark.browser
def test_thirty_students_each_get_their_own_heatmap(real_model):
    require_chromium()
    photos = [phone_jpeg(seed) for seed in range(SESSIONS)]
    wanted = [expected(real_model, data) for data in photos]
    with streamlit_server(launcher=LAUNCHER, timeout=300) as (url, proc), chromium() as browser:
        run = run_class(browser, url, proc.pid, photos, spread_s=5.0)
        got = [shown(page, url, real_model.size) for page in run.pages]
        for page in run.pages:
            assert page.locator("[data-testid='stException']").count() == 0
            assert page.locator("[data-testid='stAlertContentError']").count() == 0
        assert proc.poll() is None
    print(f"\n{SESSIONS} sessions: median {run.median:.2f} s, p95 {run.p95:.2f} s, slowest {max(run.waits):.2f} s, "
          f"server CPU {run.cpu_per_upload:.3f} s per upload, memory afterwards {run.rss_after / 2**30:.2f} GB")
    for i, picture in enumerate(got):
        distances = [float(np.abs(picture - w).mean()) for w in wanted]
        assert distances[i] < 2.0, (i, distances[i])  # their own photo's map, up to JPEG transport
        assert int(np.argmin(distances)) == i  # not a classmate's
    assert run.rss_after <= MEMORY_LIMIT
