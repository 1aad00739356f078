"""``attnviz qk``: the JSON's coordinates against an independent PCA of the capture's own q and k."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import attnviz
from attnviz import dataset
from attnviz.cli import main
from conftest import ASSETS, Q, K
from test_qkmap import independent_pca, same_up_to_sign


def test_cli_pca_none_equals_independent_pca(tmp_path, real_model, capsys):
    photos = [str(ASSETS / "cat.jpg"), str(ASSETS / "rocket.jpg")]
    out = tmp_path / "qk.json"
    assert main(["qk", *photos, "--layer", "6", "--head", "3", "--method", "pca", "--normalize", "none",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    caps = [attnviz.capture(real_model, attnviz.load_photo(p, real_model).image) for p in photos]
    n = caps[0].num_tokens
    points = doc["points"]
    assert len(points) == 2 * 2 * n and doc["layer"] == 6 and doc["head"] == 3
    assert [p["kind"] for p in points[:2 * n]] == ["query"] * n + ["key"] * n
    assert [p["token"] for p in points[:2 * n]] == list(range(n)) * 2
    assert {p["photo"] for p in points[2 * n:]} == {photos[1]}
    stacked = np.concatenate([np.concatenate([Q(c)[5, 2].double().numpy(), K(c)[5, 2].double().numpy()]) for c in caps])
    xy = np.array([[p["x"], p["y"]] for p in points])
    assert same_up_to_sign(independent_pca(stacked), xy) <= 1e-4
    assert "Spearman" in capsys.readouterr().out


def test_cli_refuses_in_one_line(tmp_path, capsys):
    out = str(tmp_path / "qk.json")
    assert main(["qk", "--layer", "1", "--head", "1", "--json", out]) == 2
    assert capsys.readouterr().err.strip() == "error: give photos or --run RUNDIR (one of the two)."
    assert main(["qk", str(ASSETS / "cat.jpg"), "--layer", "13", "--head", "1", "--json", out]) == 2
    assert capsys.readouterr().err.strip() == "error: --layer must be 1…12, not 13."
    missing = tmp_path / "nope.jpg"
    assert main(["qk", str(missing), "--layer", "1", "--head", "1", "--json", out]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.jpg" in err[0]
    assert not (tmp_path / "qk.json").exists()


def test_cli_reads_a_runs_stored_captures(tmp_path, real_model):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("cat.jpg", "coffee.jpg"):
        shutil.copy(ASSETS / name, folder / name)
    run = tmp_path / "run"
    dataset.run_local(folder, run, dataset.RunConfig(store="qk", size=56), progress=False)
    caps, paths = attnviz.qkmap.run_captures(run)
    assert [p.split("/")[-1] for p in paths] == ["cat.jpg", "coffee.jpg"]
    out = tmp_path / "run.json"
    assert main(["qk", "--run", str(run), "--layer", "12", "--head", "6", "--normalize", "none", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    stacked = np.concatenate([np.concatenate([Q(c)[11, 5].double().numpy(), K(c)[11, 5].double().numpy()]) for c in caps])
    xy = np.array([[p["x"], p["y"]] for p in doc["points"]])
    assert same_up_to_sign(independent_pca(stacked), xy) <= 1e-4
    # The stored captures are those of the photos: the same q and k as a fresh capture at 56 px.
    small = attnviz.load_model(size=56, device="cpu")
    fresh = attnviz.capture(small, attnviz.load_photo(folder / "cat.jpg", small).image)
    assert np.abs(Q(fresh).numpy() - Q(caps[0]).numpy()).max() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("method, package", [("tsne", "scikit-learn"), ("umap", "umap-learn")])
def test_cli_says_how_to_get_a_missing_projection(tmp_path, capsys, monkeypatch, method, package):
    monkeypatch.setattr(attnviz.qkmap, "available", lambda method: method == "pca")  # as where it is not installed
    assert main(["qk", str(ASSETS / "cat.jpg"), "--layer", "1", "--head", "1", "--method", method,
                 "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and f"the {package} package: pip install 'attnviz[qk]'" in err
    assert not (tmp_path / "x.json").exists()


def test_cli_umap_is_every_point_and_seeded(tmp_path, real_model, capsys):
    pytest.importorskip("umap", reason="UMAP needs umap-learn (pip install 'attnviz[qk]')")
    photo = ASSETS / "cat.jpg"
    out = tmp_path / "umap.json"
    assert main(["qk", str(photo), "--layer", "6", "--head", "1", "--method", "umap", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    n = 197  # the offline ViT-S/14 at 196 px: 1 + 14 × 14 tokens
    assert doc["method"] == "umap" and len(doc["points"]) == 2 * n
    assert sorted((p["kind"], p["token"]) for p in doc["points"]) == sorted(
        [("query", i) for i in range(n)] + [("key", i) for i in range(n)])  # every query and key, once
    xy = np.array([[p["x"], p["y"]] for p in doc["points"]])
    assert np.isfinite(xy).all() and xy.std(0).min() > 0.1  # spread out in both axes, not collapsed
    # Seeded: the library, run again on a fresh capture of the same photo, gives exactly these coordinates.
    cap = attnviz.capture(real_model, attnviz.load_photo(photo, real_model).image)
    assert np.array_equal(attnviz.qkmap.qk_map(cap, 5, 0, method="umap").xy, xy)
    assert "umap" in capsys.readouterr().out


def test_cli_never_writes_its_json_onto_a_photo_or_into_the_run_it_reads(tmp_path, capsys, monkeypatch):
    """Before, ``--json`` naming the photo replaced the JPEG with JSON (exit 0), and ``--json R/run.json``
    destroyed the run; now both are one line, exit 2, before the model loads, and every input stays as it was."""
    from attnviz import models

    photo = tmp_path / "cat.jpg"
    shutil.copy(ASSETS / "cat.jpg", photo)
    before = photo.read_bytes()
    loads = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loads.append(a) or attnviz.load_model(size=56))
    assert main(["qk", str(photo), "--layer", "1", "--head", "1", "--json", str(photo)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --json {photo} would overwrite the input {photo} ({photo}); nothing was written, so name "
                   "another file.\n")
    link = tmp_path / "out.json"
    link.symlink_to(photo)  # an output that is a link to the photo is the photo too
    assert main(["qk", str(photo), "--layer", "1", "--head", "1", "--json", str(link)]) == 2
    assert photo.read_bytes() == before and loads == []
    capsys.readouterr()

    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("cat.jpg", "coffee.jpg"):
        shutil.copy(ASSETS / name, folder / name)
    run = tmp_path / "run"
    dataset.run_local(folder, run, dataset.RunConfig(store="qk", size=56), progress=False)
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for target in (run / "run.json", run / "qk.json"):
        assert main(["qk", "--run", str(run), "--layer", "1", "--head", "1", "--json", str(target)]) == 2
        assert capsys.readouterr().err == (f"error: --json {target} is inside the folder {run}, whose files this "
                                           "command reads; nothing was written, so name another file.\n")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files
    assert main(["qk", "--run", str(run), "--layer", "1", "--head", "1", "--json", str(tmp_path / "qk.json")]) == 0
