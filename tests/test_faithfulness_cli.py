"""``attnviz faithfulness``: the JSON layout of issue #20, every value against the independent references
of tests/test_faithfulness.py and tests/test_ablation.py, and one line for every problem."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import attnviz
from attnviz import cli, models

from conftest import ASSETS, tiny_vit
from test_ablation import reference_grid
from test_faithfulness import reference_curves


@pytest.fixture
def tiny_cli(monkeypatch, tmp_path):
    model = tiny_vit(seed=5)
    with torch.no_grad():
        for block in model.network.blocks:
            block.attn.qkv.weight[:64] *= 4.0
    monkeypatch.setattr(models, "load_model", lambda *a, **k: model)
    photo = tmp_path / "photo.png"
    Image.open(ASSETS / "cat.jpg").convert("RGB").resize((48, 40)).save(photo)
    return model, photo


@pytest.mark.parametrize("fill", ["token", "mean"])
def test_json_layout_and_every_value(tiny_cli, tmp_path, fill, capsys):
    model, photo = tiny_cli
    out = tmp_path / "out.json"
    assert cli.main(["faithfulness", str(photo), "--fill", fill, "--ablation", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["fill"] == fill and record["measure"] == "probability"
    names = [m["name"] for m in record["maps"]]
    assert names[:2] == ["attention, layer 1, mean of heads", "attention, layer 2, mean of heads"]
    assert names[-5:] == [f"random order {i}" for i in range(1, 6)]
    cap = attnviz.capture(model, attnviz.load_photo(photo, model).image)
    for entry in record["maps"]:
        assert set(entry) == {"name", "order", "removed", "deletion", "insertion", "deletion_area", "insertion_area"}
        assert entry["removed"] == [0, 1, 3, 4, 6, 8, 9, 11, 12, 14, 16]
        counts, deletion, insertion = reference_curves(model, cap, np.array(entry["order"]), fill)
        assert np.abs(np.array(entry["deletion"]) - deletion).max() <= 1e-4
        assert np.abs(np.array(entry["insertion"]) - insertion).max() <= 1e-4
        assert entry["deletion_area"] == pytest.approx(np.trapezoid(deletion, dx=0.1), abs=1e-4)
    first = record["maps"][1]["order"]
    grid = cap.cls_map(1, "mean").ravel()
    assert grid[first[0]] == grid.max()  # most important first, raster indices
    assert np.abs(np.array(record["ablation"]) - reference_grid(model, cap)).max() <= 1e-4
    assert len(record["ablation"]) == 2 and all(len(row) == 4 for row in record["ablation"])
    printed = capsys.readouterr().out
    assert record["sentence"] in printed and "On this photo" in record["sentence"]


def test_problems_are_one_line(tiny_cli, tmp_path, capsys):
    model, photo = tiny_cli
    assert cli.main(["faithfulness", str(tmp_path / "missing.jpg"), "--json", str(tmp_path / "o.json")]) == 1
    assert cli.main(["faithfulness", str(photo), "--json", str(photo)]) == 2
    assert cli.main(["faithfulness", str(photo), "--random", "1", "--json", str(tmp_path / "o.json")]) == 2
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a photo")
    assert cli.main(["faithfulness", str(bad), "--json", str(tmp_path / "o.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("error: ") for line in err)
    assert not (tmp_path / "o.json").exists()
    assert photo.read_bytes()[:4] == b"\x89PNG"  # the photo was not overwritten


def test_token_fill_refused_for_rope_with_one_line(monkeypatch, tmp_path, capsys):
    import timm

    torch.manual_seed(0)
    network = timm.create_model("vit_small_patch16_rope_224", pretrained=False, num_classes=3, img_size=32,
                                depth=1, embed_dim=32, num_heads=2).eval()
    model = attnviz.wrap(network, "rope", "random init", 32)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: model)
    photo = tmp_path / "p.png"
    Image.new("RGB", (32, 32), (200, 10, 10)).save(photo)
    assert cli.main(["faithfulness", str(photo), "--json", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not available" in err
    assert cli.main(["faithfulness", str(photo), "--fill", "blur", "--random", "2", "--quiet",
                     "--json", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["fill"] == "blur"


@pytest.mark.slow
def test_real_model_json(tmp_path, real_model):
    """The offline model through the command line (~1 min on a shared 2-core machine): --slow."""
    out = tmp_path / "cat.json"
    assert cli.main(["faithfulness", str(ASSETS / "cat.jpg"), "--random", "2", "--ablation", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["measure"] == "cosine" and len(record["ablation"]) == 12 and len(record["ablation"][0]) == 6
    cap = attnviz.capture(real_model, attnviz.load_photo(ASSETS / "cat.jpg", real_model).image)
    entry = next(m for m in record["maps"] if m["name"] == "attention, layer 12, mean of heads")
    _, deletion, insertion = reference_curves(real_model, cap, np.array(entry["order"]), "token")
    assert np.abs(np.array(entry["deletion"]) - deletion).max() <= 1e-4
    assert np.abs(np.array(entry["insertion"]) - insertion).max() <= 1e-4
