"""The Dataset page's Q/K map and patch search, on a run kept with --store qk, checked by hand."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import i18n, qkmap
from attnviz_app import qk_scatter
from attnviz.dataset import RunConfig, run_local
from conftest import APP, Q, K, SCALE
from dataset_fixtures import SMALL, one_thread, photo_folder  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("qkruns")
    run_local(photo_folder(root / "in"), root / "kept", RunConfig(size=SMALL, store="qk"), progress=False)
    return root


def open_page(lang: str, monkeypatch, root, **state) -> AppTest:
    monkeypatch.setenv("ATTNVIZ_DATASETS", str(root))
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = lang
    for key, value in state.items():
        at.session_state[key] = value
    return at.switch_page("screens/dataset.py").run()


def by_hand(root: Path, layer: int, head: int):
    """The run's stored captures, and ρ(q·k, 2-D distance) of the raw points by SVD PCA, ranks, corrcoef."""
    files = sorted((root / "kept" / "captures").glob("*.npz"))
    caps = [attnviz.load_capture(f) for f in files]
    n = caps[0].num_tokens
    vectors = np.concatenate([np.concatenate([Q(c)[layer, head].double().numpy(), K(c)[layer, head].double().numpy()])
                              for c in caps])
    centred = vectors - vectors.mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    xy = u[:, :2] * s[:2]
    logits, dist = [], []
    for i, c in enumerate(caps):
        q, k = Q(c)[layer, head].double().numpy(), K(c)[layer, head].double().numpy()
        logits.append((q @ k.T * SCALE(c)).ravel())
        block = xy[i * 2 * n:(i + 1) * 2 * n]
        dist.append(np.linalg.norm(block[:n, None] - block[None, n:], axis=-1).ravel())
    logits, dist = np.concatenate(logits), np.concatenate(dist)
    rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
    return caps, np.corrcoef(rank(logits), rank(dist))[0, 1]


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_dataset_qk_map_and_patch_search(runs, monkeypatch, lang):
    at = open_page(lang, monkeypatch, runs, dataset_qk_normalize="none", dataset_qk_photo=0,
                   dataset_qk_row=2, dataset_qk_col=3)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error and not at.warning, [e.value for e in [*at.error, *at.warning]]
    assert len(at.get("vega_lite_chart")) == 1  # every head; this head's queries and keys are the WebGL scatter's
    (scatter,) = at.get("bidi_component")
    head, points = qk_scatter.unpack(scatter.proto.bytes)
    qk = qkmap.qk_map(qkmap.run_captures(runs / "kept")[0], 11, 0, normalize="none")
    assert np.array_equal(points["x"], qk.xy[:, 0].astype(np.float32)) and len(points) == 4 * 2 * 17
    assert head["words"]["query"] == i18n.text(lang, "qkmap.query")
    text = "\n".join(m.value for m in at.markdown)
    caps, rho = by_hand(runs, 11, 0)
    assert i18n.text(lang, "qkmap.dataset_header", layer=12, head=1) in [h.value for h in at.subheader]
    assert f"{rho:+.2f}" in text
    assert i18n.text(lang, "qkmap.dataset_caption", photos=4, points=4 * 2 * 17) in [c.value for c in at.caption]
    # The patch search: photo 0 (path order), patch (2, 3); its query against every other photo's patch keys.
    stored, paths = attnviz.qkmap.run_captures(runs / "kept")
    q = Q(stored[0])[11, 0, 1 + 1 * 4 + 2].double()
    found = sorted(((float(K(stored[i])[11, 0, j].double() @ q) * SCALE(stored[0]), i, j)
                    for i in range(1, 4) for j in range(1, 17)), reverse=True)[:8]
    shown = " ".join(img.caption for el in at.get("image") for img in el.proto.imgs)
    for rank, (logit, i, j) in enumerate(found, 1):
        patch = i18n.text(lang, "analysis.patch", row=(j - 1) // 4 + 1, col=(j - 1) % 4 + 1)
        expected = i18n.text(lang, "qkmap.search_match", rank=rank, name=Path(paths[i]).name, patch=patch, logit=logit)
        assert expected in shown, expected


def test_a_run_without_stored_captures_says_how(tmp_path, monkeypatch):
    run_local(photo_folder(tmp_path / "in"), tmp_path / "plain", RunConfig(size=SMALL), progress=False)
    at = open_page("en", monkeypatch, tmp_path)
    assert not at.exception
    assert i18n.text("en", "qkmap.dataset_no_store") in [i.value for i in at.info]
