"""Dataset runs on the local engine: the numbers, the tables, errors, resuming and the command line."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import attnviz
from attnviz import Capture, capture, cli, dataset, load_photo, runfiles
from attnviz.dataset import RunConfig, read_run, run_local

from conftest import ASSETS, tiny_vit, Q, K, SCALE
from dataset_fixtures import SMALL, one_thread, photo_folder, same_tables  # noqa: F401 (autouse fixture)

CONFIG = RunConfig(size=SMALL)


@pytest.fixture(scope="module")
def small_model():
    return CONFIG.load()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("dataset"))


@pytest.fixture(scope="module")
def clean_run(folder, small_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "run"
    summary = run_local(folder, out, CONFIG, batch=3, progress=False, model=small_model)
    return summary, read_run(out)


# --- Which files ------------------------------------------------------------------------------

def test_folder_walk_and_list_file(folder, tmp_path):
    found = dataset.list_images(folder)
    names = [p.removeprefix(str(folder) + "/") for p in found]
    assert names == ["cat.jpg", "more/gradient.png", "more/noise.webp", "notes.jpg", "rocket.jpg"]
    listing = tmp_path / "list.txt"
    listing.write_text(f"# two photos\n{folder / 'cat.jpg'}\n\n{folder.name}/missing.png\n{folder / 'cat.jpg'}\n")
    listing.rename(folder.parent / "list.txt")
    listed = dataset.list_images(folder.parent / "list.txt")
    assert listed == [str(folder / "cat.jpg"), str(folder / "missing.png")]  # relative to the list; repeats once
    with pytest.raises(attnviz.RunError, match="does not exist; name a folder of photos or a list file"):
        dataset.list_images(tmp_path / "nowhere")


# --- The numbers ------------------------------------------------------------------------------

def test_head_rows_match_an_independent_recomputation(real_model):
    """Every statistic of one photo's rows, recomputed in float64 NumPy from the queries and keys."""
    data = (ASSETS / "cat.jpg").read_bytes()
    tables = dataset.split(dataset.analyse(real_model, [("cat.jpg", data)]))
    heads = tables.heads.to_pandas()
    cap = capture(real_model, load_photo(ASSETS / "cat.jpg", real_model).image)
    num_layers, num_heads, n, _ = Q(cap).shape
    h, w = cap.grid
    assert len(heads) == num_layers * num_heads and list(heads["layer"][:7]) == [0] * 6 + [1]
    patch_px = cap.input.shape[-1] / w
    centres = (np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij"), -1).reshape(-1, 2) + 0.5) * patch_px
    dist = np.linalg.norm(centres[:, None] - centres[None], axis=-1)  # (P, P) pixels
    for layer, head in [(0, 0), (5, 3), (11, 5)]:
        q, k = Q(cap)[layer, head].double().numpy(), K(cap)[layer, head].double().numpy()
        logits = q @ k.T * SCALE(cap)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)  # (N, N)
        row = weights[0]
        patches = row[1:]
        order = np.sort(patches)[::-1].cumsum() / patches.sum()
        patch_rows = weights[1:, 1:] / weights[1:, 1:].sum(-1, keepdims=True)
        got = heads[(heads["layer"] == layer) & (heads["head"] == head)].iloc[0]
        assert got.entropy == pytest.approx(-(row * np.log(row)).sum(), abs=1e-5)
        assert got.prefix_share == pytest.approx(row[0], abs=1e-6)
        assert got.distance_px == pytest.approx((patch_rows * dist).sum(-1).mean(), abs=1e-4)
        assert got.top_patch == int(np.argmax(patches))
        assert got.mass60_fraction == pytest.approx((np.searchsorted(order, 0.6 - 1e-12) + 1) / (h * w))
    image = tables.images.to_pylist()[0]
    assert (image["width"], image["height"], image["grid_h"], image["input_size"]) == (451, 300, 14, 196)
    assert image["top5_labels"] is None  # the offline backbone has no classifier


def test_classifier_gets_its_top5():
    model = tiny_vit(num_classes=10)
    tables = dataset.split(dataset.analyse(model, [("cat.jpg", (ASSETS / "cat.jpg").read_bytes())]))
    image = tables.images.to_pylist()[0]
    cap = capture(model, load_photo(ASSETS / "cat.jpg", model).image)
    expected = model.top_classes(cap.output)
    assert image["top5_labels"] == [label for label, _ in expected]
    assert np.allclose(image["top5_probs"], [p for _, p in expected], atol=1e-6)


# --- Tables, errors, resuming ----------------------------------------------------------------------

def test_run_writes_three_tables_and_an_errors_row(folder, clean_run):
    summary, tables = clean_run
    assert (summary.listed, summary.images, summary.errors, summary.skipped) == (5, 4, 1, 0)
    paths = tables.images["path"].to_pylist()
    assert [p.rsplit("/", 1)[1] for p in paths] == ["cat.jpg", "gradient.png", "noise.webp", "rocket.jpg"]
    assert tables.heads.num_rows == 4 * 12 * 6
    error = tables.errors.to_pylist()[0]
    assert error["path"].endswith("notes.jpg") and error["error_key"] == "unreadable"
    assert "is not an image" in error["error"] and json.loads(error["error_values"])["name"] == error["path"]
    heads = tables.heads.to_pandas()
    assert heads.entropy.between(0, math.log(1 + 16)).all() and heads.mass60_fraction.between(1 / 16, 1).all()
    assert set(heads.digest) == set(tables.images["digest"].to_pylist())


def test_rerun_skips_what_is_done(folder, clean_run, small_model, tmp_path):
    out = tmp_path / "run"
    run_local(folder, out, CONFIG, batch=3, progress=False, model=small_model)
    again = run_local(folder, out, CONFIG, batch=3, progress=False, model=small_model)
    assert (again.skipped, again.images, again.errors) == (5, 0, 0)
    same_tables(read_run(out), clean_run[1])


def test_resume_after_an_interrupted_run(folder, clean_run, small_model, tmp_path, monkeypatch):
    out = tmp_path / "run"
    analyse, seen = dataset.analyse, []

    def interrupted(model, items, *args, **kwargs):
        items = list(items)
        if seen:
            raise KeyboardInterrupt  # Ctrl-C during the second batch
        seen.extend(path for path, _ in items)
        return analyse(model, items, *args, **kwargs)

    monkeypatch.setattr(dataset, "analyse", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_local(folder, out, CONFIG, batch=2, progress=False, model=small_model)
    assert len(seen) == 2 and read_run(out).images.num_rows + read_run(out).errors.num_rows == 2

    monkeypatch.setattr(dataset, "analyse", analyse)
    resumed = run_local(folder, out, CONFIG, batch=2, progress=False, model=small_model)
    assert (resumed.skipped, resumed.images + resumed.errors) == (2, 3)
    same_tables(read_run(out), clean_run[1])


def test_a_batch_cut_between_its_parts_is_redone_once(folder, clean_run, small_model, tmp_path):
    """Heads written, images part lost (the process died in between): the rerun redoes that batch and the
    reader keeps one copy of each row."""
    out = tmp_path / "run"
    run_local(folder, out, CONFIG, batch=5, progress=False, model=small_model)
    for part in (out / "images").glob("part-*.parquet"):
        part.unlink()
    assert pq.read_table(next((out / "heads").glob("part-*.parquet"))).num_rows == 4 * 72
    resumed = run_local(folder, out, CONFIG, batch=5, progress=False, model=small_model)
    assert (resumed.skipped, resumed.images) == (1, 4)  # the errors row had landed
    assert len(list((out / "heads").glob("part-*.parquet"))) == 1  # the orphan was removed before the redo
    heads = pads.dataset(out / "heads", format="parquet").to_table().to_pandas()  # any Parquet reader
    assert len(heads) == 4 * 72 and not heads.duplicated(["path", "layer", "head"]).any()
    same_tables(read_run(out), clean_run[1])


def test_the_tables_have_the_schemas_the_page_checks(clean_run):
    """attnviz.runfiles checks a run's parts against these schemas: what the engine writes must pass."""
    _, tables = clean_run
    for name, schema in runfiles.SCHEMAS.items():
        assert getattr(tables, name).schema.equals(schema), name


def test_a_rerun_with_other_settings_is_refused(folder, tmp_path, capsys, small_model):
    out = tmp_path / "run"
    run_local(folder / "more", out, CONFIG, progress=False, model=small_model)
    with pytest.raises(dataset.RunError, match="other settings"):
        run_local(folder / "more", out, RunConfig(size=SMALL, fit="squash"), progress=False, model=small_model)
    assert cli.main(["dataset", str(folder / "more"), "--out", str(out), "--size", "84", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "other settings (size)" in err and "\n" == err[-1] and err.count("\n") == 1


def test_command_line(folder, clean_run, tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["dataset", str(folder), "--out", str(out), "--size", str(SMALL), "--batch", "2", "--quiet"])
    assert code == 1  # one unusable file
    assert "4 images and 1 unusable files" in capsys.readouterr().out
    assert json.loads((out / "run.json").read_text())["size"] == SMALL
    same_tables(read_run(out), clean_run[1])
    assert cli.main(["dataset", str(tmp_path / "nowhere"), "--out", str(out), "--quiet"]) == 2


def test_stored_capture_reloads_as_a_fresh_capture(folder, small_model, tmp_path):
    export = pytest.importorskip("attnviz.export", reason="the compact export (attnviz.export) is not merged yet")
    out = tmp_path / "run"
    run_local(folder / "more", out, dataclasses.replace(CONFIG, store="qk"), batch=2, progress=False,
              model=small_model)
    images = read_run(out).images.to_pylist()
    assert sorted(p.name for p in (out / "captures").iterdir()) == sorted(f"{r['digest']}.npz" for r in images)
    for record in images:
        stored = export.load_capture(out / "captures" / f"{record['digest']}.npz")
        fresh = capture(small_model, load_photo(record["path"], small_model).image)
        for f in dataclasses.fields(fresh):
            a, b = getattr(stored, f.name), getattr(fresh, f.name)
            if f.name in ("query", "key", "token_norms"):  # per layer
                assert len(a) == len(b) and all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b)), f.name
            elif isinstance(a, torch.Tensor):
                assert torch.allclose(a, b, atol=1e-5), f.name
            elif f.name == "layouts":
                assert [(x.grid, x.prefix, x.num_heads, x.windows.tolist()) for x in a] == [
                    (y.grid, y.prefix, y.num_heads, y.windows.tolist()) for y in b]
            elif f.name != "seconds":
                assert a == b, f.name
        assert np.allclose(stored.weights(3, 1), fresh.weights(3, 1), atol=1e-5)


def test_a_model_without_class_token_gets_its_stated_summary():
    if not hasattr(Capture, "summary_map"):
        pytest.skip("needs the capture core's summary_map for models without a class token")
    torch.manual_seed(0)
    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=0,
                                class_token=False, global_pool="avg")
    model = attnviz.wrap(network, "tiny without class token", "random init", 32)
    data = (ASSETS / "cat.jpg").read_bytes()
    heads = dataset.split(dataset.analyse(model, [("cat.jpg", data)])).heads.to_pandas()
    cap = capture(model, load_photo(ASSETS / "cat.jpg", model).image)
    assert not cap.has_class_token and len(heads) == 2 * 4
    for row in heads.itertuples():
        summary = cap.summary_map(row.layer, row.head)  # (4, 4)
        assert row.top_patch == int(np.argmax(summary))
        order = np.sort(summary.ravel())[::-1].cumsum() / summary.sum()
        assert row.mass60_fraction == pytest.approx((np.searchsorted(order, 0.6 - 1e-12) + 1) / 16)
