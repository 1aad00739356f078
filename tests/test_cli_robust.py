"""The CLI over the corpus: each bad file gets one stderr line naming it, the good ones are still written."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attnviz
from attnviz import cli

from make_corpus import photo, write_corpus

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_export_over_the_corpus(corpus, tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: tiny)
    out = tmp_path / "out"
    paths = [str(p) for _, p in corpus]
    code = cli.main(["export", *paths, "--out", str(out), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()

    bad = [(e, p) for e, p in corpus if not e.ok]
    good = [(e, p) for e, p in corpus if e.ok]
    assert code == 1
    assert len(lines) == len(bad)  # one line per bad file, nothing else (no traceback)
    for (entry, path), line in zip(bad, lines):
        assert line.startswith(f"error: {path.name} ") and entry.matches(line), line
    written = files_under(out)
    assert len(written) == 2 * len(good)
    stems = dict(cli.plan(paths))  # the same name from two folders: the folder's name in front
    for _, path in good:
        stem = stems[str(path)]
        assert stem.rstrip("_") == cli.safe_stem(path.name) and {f"{stem}.npz", f"{stem}_overlay.png"} <= written


def test_exported_attention_equals_a_fresh_capture(corpus, tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: tiny)
    entry, path = next((e, p) for e, p in corpus if e.name == "exif_orientation_6.jpg")
    assert cli.main(["export", str(path), "--out", str(tmp_path), "--quiet"]) == 0
    saved = np.load(tmp_path / "exif_orientation_6.npz")
    expected = attnviz.capture(tiny, attnviz.read_photo(entry.data, tiny).image)
    assert np.array_equal(saved["attention"], expected.all_weights())
    assert np.array_equal(saved["input"], expected.input.numpy())


@pytest.mark.parametrize("name, stem", [
    ("../../etc/passwd", "passwd"),
    ("..", "image"),
    ("...", "image"),
    ("a b?c*.png", "a_b_c"),
    ("貓咪.jpg", "image"),
    ("/tmp/x/.hidden.png", "hidden"),
    ("..\\..\\windows\\evil.png", "windows_evil"),
])
def test_safe_stem_never_escapes_the_folder(name, stem):
    assert cli.safe_stem(name) == stem


def test_hostile_names_write_only_inside_out(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: tiny)
    nested = tmp_path / "in" / "a" / "b"
    nested.mkdir(parents=True)
    photo(40, 30).save(nested / "..png", format="PNG")
    photo(40, 30).save(tmp_path / "in" / "a" / "cat.png")
    photo(40, 30, seed=1).save(nested / "cat.png")
    out = tmp_path / "out"
    before = files_under(tmp_path)
    traversal = str(nested / ".." / ".." / "a" / "b" / ".." / "cat.png")
    code = cli.main(["export", str(nested / "..png"), traversal, str(nested / "cat.png"),
                     str(tmp_path / "missing.png"), str(nested), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err == [f"error: {tmp_path / 'missing.png'} does not exist.", f"error: {nested} is not a file."]
    assert files_under(out) == {"image.npz", "image_overlay.png", "a_cat.npz", "a_cat_overlay.png",
                                "b_cat.npz", "b_cat_overlay.png"}  # two cats, neither overwritten, each its folder's
    assert files_under(tmp_path) - before == {"out", *(f"out/{f}" for f in files_under(out))}


def test_real_cli_entry_point(corpus, tmp_path):
    """The installed entry point with the real offline model: exit code, stderr line, outputs."""
    chosen = [p for e, p in corpus if e.name in ("truncated.jpg", "bomb_60000.png", "cmyk.jpg", "strip.png")]
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "attnviz", "export", *map(str, chosen), "--out", str(out), "--quiet",
         "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1, run.stderr
    assert [ln.split(" ")[1] for ln in lines if ln.startswith("error:")] == ["truncated.jpg", "bomb_60000.png"]
    assert not any("Traceback" in ln for ln in lines)
    assert files_under(out) == {"cmyk.npz", "cmyk_overlay.png", "strip.npz", "strip_overlay.png"}
    assert np.load(out / "strip.npz")["attention"].shape == (12, 6, 197, 197)
