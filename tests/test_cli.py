"""`python -m attnviz export`: files, shapes, values, and one-line errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import cli
from attnviz.cli import safe_stem
from conftest import ASSETS, ROOT, Q


def test_export_writes_exact_arrays_and_reports_bad_files(tmp_path, real_model):
    bad = tmp_path / "notes.jpg"
    bad.write_text("this is text, not a photo")
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "attnviz", "export", str(ASSETS / "cat.jpg"), str(bad), str(ASSETS / "coffee.jpg"),
         "--out", str(out), "--quiet", "--rollout"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: notes.jpg is not an image")
    assert sorted(p.name for p in out.iterdir()) == ["cat.npz", "cat_overlay.png", "coffee.npz", "coffee_overlay.png"]

    z = np.load(out / "cat.npz")
    assert z["attention"].shape == (12, 6, 197, 197) and z["attention"].dtype == np.float32
    assert z["input"].shape == (1, 3, 196, 196)
    assert z["grid"].tolist() == [14, 14] and int(z["num_prefix_tokens"]) == 1
    cap = attnviz.capture(real_model, Image.open(ASSETS / "cat.jpg"))
    np.testing.assert_array_equal(z["input"], cap.input.numpy())
    np.testing.assert_allclose(z["attention"][11, 2], cap.weights(11, 2), atol=1e-6)
    assert Image.open(out / "cat_overlay.png").size == (196, 196)
    from attnviz.rollout import rollout_map

    np.testing.assert_allclose(z["rollout"], rollout_map(cap, head="mean", discard=0.0, residual=0.5), atol=1e-6)
    assert z["rollout"].shape == (14, 14)


def test_safe_stem_blocks_path_traversal():
    assert safe_stem("../../etc/passwd") == "passwd"
    assert safe_stem("/tmp/..hidden.jpg") == "hidden"
    assert safe_stem("ä photo (1).jpg") == "photo_1"
    assert safe_stem("....jpg") == "image"


def test_two_inputs_with_the_same_name_from_different_folders_get_distinct_files_recording_each(tmp_path, monkeypatch):
    """Before: x.npz and x_.npz, both recording ``file: x.jpg``; now a_x and b_x, recording a/x.jpg and b/x.jpg."""
    from attnviz import export as exporting
    from conftest import tiny_vit

    model = tiny_vit()
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: model)
    for folder, colour in (("a", (200, 30, 30)), ("b", (30, 30, 200))):
        (tmp_path / folder).mkdir()
        Image.new("RGB", (48, 40), colour).save(tmp_path / folder / "x.jpg")
    out = tmp_path / "out"
    assert cli.main(["export", str(tmp_path / "a" / "x.jpg"), str(tmp_path / "b" / "x.jpg"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a_x.npz", "a_x_overlay.png", "b_x.npz", "b_x_overlay.png"]
    assert exporting.read_meta(out / "a_x.npz")["source"]["file"] == "a/x.jpg"
    assert exporting.read_meta(out / "b_x.npz")["source"]["file"] == "b/x.jpg"
    red = attnviz.capture(model, Image.open(tmp_path / "a" / "x.jpg"))
    assert np.allclose(Q(attnviz.load_capture(out / "a_x.npz")).numpy(), Q(red).numpy(), atol=1e-6)
    assert cli.plan(["x.jpg", "x.png", "c/y.jpg"]) == [("x.jpg", "x"), ("x.png", "x_"), ("c/y.jpg", "y")]


def test_faithfulness_help_says_percent_once(capsys):
    with pytest.raises(SystemExit):
        cli.main(["faithfulness", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "remove them 10 % at a time" in text and "%%" not in text


def test_inputs_of_one_name_in_folders_of_one_name_are_told_apart_by_as_much_of_their_path_as_it_takes(
        tmp_path, monkeypatch):
    """Before: a/x/p.jpg and b/x/p.jpg became p.npz and p_.npz, both recording ``file: x/p.jpg``."""
    from attnviz import export as exporting
    from conftest import tiny_vit

    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: tiny_vit())
    photos = [tmp_path / "a" / "x" / "p.jpg", tmp_path / "b" / "x" / "p.jpg", tmp_path / "c" / "p.jpg"]
    for photo in photos:
        photo.parent.mkdir(parents=True)
        Image.new("RGB", (40, 40), (200, 30, 30)).save(photo)
    out = tmp_path / "out"
    assert cli.main(["export", *map(str, photos), "--out", str(out), "--format", "qk", "--quiet"]) == 0
    recorded = {p.name: exporting.read_meta(p)["source"]["file"] for p in out.glob("*.npz")}
    assert recorded == {"a_x_p.npz": "a/x/p.jpg", "b_x_p.npz": "b/x/p.jpg", "c_p.npz": "c/p.jpg"}
    monkeypatch.chdir(tmp_path / "a")  # relative names: told apart by their absolute paths, recorded by their ends
    assert cli.recorded_names(["x/p.jpg", "../b/x/p.jpg", "x/p.jpg"]) == {"x/p.jpg": "a/x/p.jpg",
                                                                        "../b/x/p.jpg": "b/x/p.jpg"}
    assert cli.plan(["x/p.jpg", "../b/x/p.jpg"]) == [("x/p.jpg", "a_x_p"), ("../b/x/p.jpg", "b_x_p")]


def test_a_full_export_over_100_mb_a_photo_is_said_before_the_first_photo(tmp_path, monkeypatch, capsys):
    """Before, a Swin-T's default --format full wrote 298 MB a photo without a word (its matrices are mostly the
    zeros between windows); now the size is said once, with what --format qk keeps instead."""
    import timm

    from attnviz import export as exporting
    from conftest import tiny_vit

    swin = attnviz.wrap(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False), "swin_tiny", "random", 224)
    assert exporting.attention_bytes(swin.layouts) == 277_056_192  # + 11 MB of q and k: the 298 MB file
    assert exporting.attention_bytes(swin.layouts, "float16") == 277_056_192 // 2
    tiny = tiny_vit()
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: tiny)
    for name in ("a.jpg", "b.jpg"):
        Image.new("RGB", (40, 40), (200, 30, 30)).save(tmp_path / name)
    photos = [str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")]
    assert cli.main(["export", *photos, "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""  # a small model: nothing to say
    monkeypatch.setattr(cli, "LARGE_EXPORT_BYTES", 1000)  # the tiny ViT's 2 × 4 × 17 × 17 floats are 9248 bytes
    assert cli.main(["export", *photos, "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert np.load(tmp_path / "out" / "a.npz")["attention"].nbytes == 9248
    assert capsys.readouterr().err == (
        "note: --format full writes 0 MB of attention weights per photo for tiny (every layer's N × N matrix); "
        "--format qk leaves them out and load_capture recomputes the same weights from the queries and keys.\n")
    assert cli.main(["export", *photos, "--out", str(tmp_path / "out"), "--format", "qk", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
