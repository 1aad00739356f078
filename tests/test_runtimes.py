"""The capture's forward on ONNX Runtime and OpenVINO equals PyTorch's, or the model stays on PyTorch.

The references are computed here, outside the code under test: every layer's q and k from a plain loop
over the timm blocks (each block's own ``norm1`` and ``qkv`` applied by hand), the weights from them by
softmax, and for the real model the same loop in float64. Exports go to a temporary cache folder.
"""
from __future__ import annotations

import copy
import importlib.util
import logging
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import attnviz
from attnviz import ModelError, runtimes
from attnviz.capture import capture_tensor
from attnviz.live import LiveSettings, heatmap_frame
from conftest import tiny_vit, Q, K
from test_families import FAMILIES, build, eager_weights

RUNTIMES = sorted(runtimes.RUNTIMES)
INSTALLED = all(importlib.util.find_spec(package) is not None for package in ("onnxruntime", "openvino"))
# Every test but the missing-package one needs the extra (CI installs it from requirements-dev.txt).
needs_extra = pytest.mark.skipif(not INSTALLED, reason="needs pip install 'attnviz[fast]'")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("runtimes")


@pytest.fixture(scope="module")
def tiny():
    return tiny_vit()


@pytest.fixture(scope="module", params=RUNTIMES)
def tiny_fast(request, tiny, cache):
    return attnviz.fast(tiny, request.param, cache=cache)


def loop_qk(network: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, H, N, d_k) q and k from a plain loop over the timm blocks, in ``x``'s dtype."""
    with torch.no_grad():
        h = network.norm_pre(network.patch_drop(network._pos_embed(network.patch_embed(x))))  # (1, N, D)
        qs, ks = [], []
        for block in network.blocks:
            a = block.attn
            z = block.norm1(h)
            qkv = (z @ a.qkv.weight.T + a.qkv.bias).reshape(1, z.shape[1], 3, a.num_heads, a.head_dim)
            qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, 1, H, N, d_k)
            qs.append(a.q_norm(qkv[0])[0])
            ks.append(a.k_norm(qkv[1])[0])
            h = block(h)
    return torch.stack(qs), torch.stack(ks)


def loop_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(L, H, N, N) softmax(q · kᵀ / √d_k) in float64."""
    q, k = q.double(), k.double()
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)


@needs_extra
def test_tiny_runtime_q_and_k_equal_a_plain_loop_on_every_layer(tiny_fast):
    assert tiny_fast.runtime is not None and tiny_fast.runtime.name in RUNTIMES
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    got = tiny_fast.runtime.forward(x)
    q, k = loop_qk(tiny_fast.network, x)
    assert got.query.shape == got.key.shape == (2, 4, 17, 8)  # the runtime's own (L, H, N, d_k) outputs
    assert float(q.abs().max()) > 0.1  # not a trivially small comparison
    for layer in range(2):
        assert float((got.query[layer] - q[layer]).abs().max()) <= 1e-5
        assert float((got.key[layer] - k[layer]).abs().max()) <= 1e-5
    assert float((got.output - tiny_fast.network(x)[0]).abs().max()) <= 1e-5


@needs_extra
def test_tiny_runtime_capture_weights_equal_pytorch_capture(tiny, tiny_fast):
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    fast_cap, torch_cap = capture_tensor(tiny_fast, x), capture_tensor(tiny, x)
    reference = loop_weights(*loop_qk(tiny.network, x))
    for layer in range(2):
        w = fast_cap.layer_weights(layer)
        assert float((w - torch_cap.layer_weights(layer)).abs().max()) <= 1e-5
        assert float((w.double() - reference[layer]).abs().max()) <= 1e-5
    assert fast_cap.cls_map(1, "mean").shape == (4, 4)
    np.testing.assert_allclose(torch.stack(fast_cap.token_norms).numpy(), torch.stack(torch_cap.token_norms).numpy(),
                               rtol=1e-5, atol=1e-6)


@needs_extra
def test_concurrent_captures_on_one_runtime_each_get_their_own(tiny, tiny_fast):
    inputs = [torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(10 + i)) for i in range(4)]
    got: dict[int, attnviz.Capture] = {}

    def run(i: int) -> None:
        for _ in range(5):
            got[i] = capture_tensor(tiny_fast, inputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(inputs):
        assert float((got[i].layer_weights(1) - capture_tensor(tiny, x).layer_weights(1)).abs().max()) <= 1e-5


@needs_extra
def test_live_frame_on_the_runtime_is_the_pytorch_frame(tiny, tiny_fast, cat):
    fast_frame = heatmap_frame(cat, LiveSettings(tiny_fast, layer=1, head="mean"))
    torch_frame = heatmap_frame(cat, LiveSettings(tiny, layer=1, head="mean"))
    assert np.abs(fast_frame.cls_map - torch_frame.cls_map).max() <= 1e-5
    assert fast_frame.cls_map.sum() > 0.1  # the class token's attention over the patches, not zeros


@pytest.mark.parametrize("family", ["dinov3", "eva02", "relpos"])
@needs_extra
def test_every_family_is_exact_on_the_runtime_or_stays_on_pytorch(family, cache, caplog):
    name, kwargs = FAMILIES[family]
    network, size = build(name, kwargs), kwargs.get("img_size", 64)
    model = attnviz.wrap(network, family, "random init, peaked", size)
    with caplog.at_level(logging.WARNING, logger="attnviz.runtimes"):
        fast_model = attnviz.fast(model, "onnxruntime", cache=cache)
    lines = [r.getMessage() for r in caplog.records if r.name == "attnviz.runtimes"]
    if family in ("dinov3", "eva02"):
        assert fast_model.runtime is not None and not lines  # the RoPE rotation survives the export
    else:  # relative position: the exported output is off by ~2e-2 today, and the check says so
        assert fast_model.runtime is not None or (len(lines) == 1 and f"{family} stays on PyTorch" in lines[0])
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(5))
    cap = capture_tensor(fast_model, x)
    for layer, reference in enumerate(eager_weights(network, x)):  # timm's own eager softmax
        assert float((cap.layer_weights(layer) - reference).abs().max()) <= 1e-5


class TracedBranch(torch.nn.Module):
    """A k_norm that branches in Python on its input's values (×3 above ``threshold``): tracing keeps
    only the branch the export's input took."""

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        return k * 3.0 if float(k.abs().max()) > self.threshold else k


def largest_first_key(model: attnviz.Model, x: torch.Tensor) -> float:
    return float(capture_tensor(model, x).key[0].abs().max())


@needs_extra
def test_a_network_the_export_cannot_match_stays_on_pytorch_and_says_so(cache, caplog):
    model = tiny_vit(seed=7)
    # between layer 0's largest |k| on the export's blank input and on the probe photo: the branch differs
    blank, photo = largest_first_key(model, torch.zeros(1, 3, 32, 32)), largest_first_key(model, runtimes.probe(model))
    assert abs(blank - photo) > 1e-3
    model.tap.remove()  # the hooks read the k_norm being replaced; wrap() installs them on the new one
    del model.network._attnviz_tap
    for block in model.network.blocks:
        block.attn.k_norm = TracedBranch((blank + photo) / 2)
    model = attnviz.wrap(model.network, "branchy", "random init", 32)
    with caplog.at_level(logging.WARNING, logger="attnviz.runtimes"):
        kept = attnviz.fast(model, "onnxruntime", cache=cache)
    assert kept.runtime is None
    lines = [r.getMessage() for r in caplog.records if r.name == "attnviz.runtimes"]
    assert len(lines) == 1 and "branchy stays on PyTorch" in lines[0] and "keys differ" in lines[0], lines
    x = runtimes.probe(model)
    reference = loop_weights(*loop_qk(model.network, x))  # the loop runs the same branch: exact weights
    cap = capture_tensor(kept, x)
    for layer in range(2):
        assert float((cap.layer_weights(layer).double() - reference[layer]).abs().max()) <= 1e-5


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_missing_runtime_package_is_one_sentence_naming_the_extra(tiny, runtime, monkeypatch):
    monkeypatch.setitem(sys.modules, runtime, None)  # importing it now raises ImportError, installed or not
    with pytest.raises(ModelError) as e:
        attnviz.fast(tiny, runtime)
    assert str(e.value) == f"The {runtime} runtime is not installed; install it with pip install 'attnviz[fast]'."


def test_an_unknown_runtime_is_one_sentence(tiny):
    with pytest.raises(ModelError, match=r"^attnviz knows the runtimes onnxruntime, openvino, not 'tensorrt'\.$"):
        attnviz.fast(tiny, "tensorrt")


@needs_extra
def test_the_export_is_cached_per_weights_and_size(tiny, cache):
    first = attnviz.fast(tiny, "onnxruntime", cache=cache).runtime.path
    again = attnviz.fast(tiny, "onnxruntime", cache=cache).runtime.path
    other = attnviz.fast(tiny_vit(seed=1), "onnxruntime", cache=cache).runtime.path
    assert first == again and first.stat().st_size > 0
    assert other != first  # another network's weights never reuse this graph
    assert not list(cache.glob("*.part"))


@pytest.mark.parametrize("runtime", RUNTIMES)
@needs_extra
def test_real_model_on_the_runtime_is_exact(real_model, runtime, cache):
    fast_model = attnviz.fast(real_model, runtime, cache=cache)
    assert fast_model.runtime is not None
    photo = attnviz.load_photo(attnviz.photos.sample("astronaut"), real_model).image  # not the probe photo
    x = real_model.to_input(real_model.view(photo))
    fast_cap, torch_cap = capture_tensor(fast_model, x), capture_tensor(real_model, x)
    q64, k64 = loop_qk(copy.deepcopy(real_model.network).double(), x.double())  # float64, by hand
    assert Q(fast_cap).shape == (12, 6, 197, 64)
    for layer in range(12):
        # q and k within 1e-5 of each layer's largest value (float32 PyTorch is itself ~2e-5 from float64)
        scale = float(q64[layer].abs().max()), float(k64[layer].abs().max())
        assert float((Q(fast_cap)[layer] - Q(torch_cap)[layer]).abs().max()) <= 1e-5 * scale[0]
        assert float((K(fast_cap)[layer] - K(torch_cap)[layer]).abs().max()) <= 1e-5 * scale[1]
        reference = loop_weights(q64[layer][None], k64[layer][None])[0]
        assert float((fast_cap.layer_weights(layer).double() - reference).abs().max()) <= 1e-5
        assert float((fast_cap.layer_weights(layer) - torch_cap.layer_weights(layer)).abs().max()) <= 1e-5


@needs_extra
def test_switching_on_leaves_the_shared_network_as_it_was(cache):
    model = tiny_vit(seed=2)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        before = model.network(x)
    attnviz.fast(model, "openvino", cache=cache)
    assert not any(m.training for m in model.network.modules())  # the exporter restores the mode it found
    with torch.no_grad():
        assert torch.equal(model.network(x), before)


@needs_extra
def test_dataset_batch_on_the_runtime_gives_the_pytorch_statistics(tiny, tiny_fast):
    from attnviz.dataset import analyse

    items = [(f"{name}.jpg", attnviz.photos.sample(name).read_bytes()) for name in ("cat", "rocket")]
    fast_rows, torch_rows = analyse(tiny_fast, items).to_pylist(), analyse(tiny, items).to_pylist()
    assert len(fast_rows) == 2 and all(row["digest"] and row["error"] is None for row in fast_rows)
    for fast_row, torch_row in zip(fast_rows, torch_rows):
        assert fast_row["top5_labels"] == torch_row["top5_labels"]
        assert fast_row["top_patch"] == torch_row["top_patch"] and len(fast_row["entropy"]) == 2 * 4
        for name in ("entropy", "distance_px", "prefix_share", "mass60_fraction", "top5_probs"):
            np.testing.assert_allclose(fast_row[name], torch_row[name], rtol=1e-5, atol=1e-5, err_msg=name)


@needs_extra
def test_dataset_command_on_a_runtime_writes_the_pytorch_tables(tmp_path, monkeypatch, capsys, caplog):
    from attnviz import cli
    from attnviz.dataset import read_run
    from dataset_fixtures import SMALL, photo_folder, same_tables

    monkeypatch.setattr(runtimes, "default_cache", lambda: tmp_path / "cache")
    folder = photo_folder(tmp_path)
    args = [str(folder), "--size", str(SMALL), "--batch", "2", "--quiet"]
    with caplog.at_level(logging.INFO, logger="attnviz.runtimes"):
        assert cli.main(["dataset", *args, "--out", str(tmp_path / "fast"), "--runtime", "openvino"]) == 1  # notes.jpg
    assert any("captures on openvino" in r.getMessage() for r in caplog.records)  # switched on, not fallen back
    assert cli.main(["dataset", *args, "--out", str(tmp_path / "torch")]) == 1
    assert "4 images and 1 unusable files" in capsys.readouterr().out
    assert list((tmp_path / "cache").glob("capture-*.onnx"))  # the real model at 56 px went through the runtime
    # distances are in pixels (up to ~35 here): measured 1.5e-5 apart, a few float32 steps at that size
    same_tables(read_run(tmp_path / "fast"), read_run(tmp_path / "torch"), tol=1e-4)
    assert cli.main(["dataset", *args, "--out", str(tmp_path / "ray"), "--engine", "ray", "--runtime", "openvino"]) == 2
    assert capsys.readouterr().err == "error: --runtime works with the local engine only\n"


@needs_extra
@pytest.mark.parametrize("arch", ["ViTModel", "Dinov2Model"])
def test_hugging_face_models_are_exact_on_the_runtime_or_stay_on_pytorch(arch, tmp_path, cache, caplog):
    transformers = pytest.importorskip("transformers")
    from test_hf import VIT_PROCESSOR, save
    from test_hf import tiny as tiny_hf

    folder = save(tiny_hf(arch), tmp_path / arch, VIT_PROCESSOR)
    model = attnviz.load_model(f"hf:{folder}", device="cpu")
    with caplog.at_level(logging.INFO, logger="attnviz.runtimes"):
        fast_model = attnviz.fast(model, "onnxruntime", cache=cache)
    lines = [r.getMessage() for r in caplog.records if r.name == "attnviz.runtimes"]
    assert len(lines) <= 2 and (fast_model.runtime is not None or "stays on PyTorch" in lines[-1]), lines
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    cap = capture_tensor(fast_model, x)
    eager = getattr(transformers, arch).from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = eager(pixel_values=x, output_attentions=True)
    for layer in range(2):
        assert float((cap.layer_weights(layer) - out.attentions[layer][0]).abs().max()) <= 1e-5


@needs_extra
def test_ctrl_c_after_a_runtime_model_was_released_is_a_keyboard_interrupt(tmp_path):
    """A released OpenVINO model used to leave the process so that the next SIGINT was a segmentation fault
    (the whole test run died in tests/test_hostile_dataset.py's Ctrl-C test); compiled models are now kept."""
    import subprocess
    import sys

    script = f"""
import gc, os, signal, time
import torch, attnviz
from attnviz import faithfulness
from conftest import tiny_vit, Q, K
def run():
    model = attnviz.fast(tiny_vit(), "openvino", cache={str(tmp_path)!r})
    faithfulness.faithfulness(model, attnviz.capture_tensor(model, torch.rand(1, 3, 32, 32)), fill="token")
run(); gc.collect()
try:
    os.kill(os.getpid(), signal.SIGINT); time.sleep(0.2)
except KeyboardInterrupt:
    print("interrupted")
"""
    # run from tests/, whose conftest gives the tiny ViT (python -c puts the working folder on the path)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent)
    assert done.returncode == 0 and done.stdout.strip() == "interrupted", (done.returncode, done.stderr[-500:])


class ExactOnTheCatOnly:
    """ONNX Runtime made to round its queries 1 % off on every input but the sample cat: what a runtime close to
    its bound looks like when the check at load uses one easy photo."""

    NAME, PACKAGE = "cat-only", "onnxruntime"
    cat: np.ndarray | None = None

    @classmethod
    def start(cls, path, threads, batches=False):
        run = runtimes.RUNTIMES["onnxruntime"].start(path, threads, batches=batches)

        def skewed(x):
            out = run(x)
            if not np.array_equal(x, cls.cat):
                out = [out[0], np.asarray(out[1]) * 1.01, *out[2:]]
            return out

        return skewed


@needs_extra
def test_the_runtime_is_certified_on_photos_noise_and_extremes_not_on_one_photo(tiny, cache, monkeypatch, caplog):
    ExactOnTheCatOnly.cat = runtimes.probe(tiny).numpy()
    monkeypatch.setitem(runtimes.RUNTIMES, "cat-only", ExactOnTheCatOnly)
    cat_only = runtimes.Runtime("cat-only", Path("unused"), 1, ExactOnTheCatOnly.start(
        runtimes.graph.exported(tiny, cache), 1))
    assert runtimes.mismatch(tiny, cat_only) is None  # on the cat alone it passes: what was certified before
    with caplog.at_level(logging.WARNING, logger="attnviz.runtimes"):
        kept = attnviz.fast(tiny, "cat-only", cache=cache)
    assert kept.runtime is None  # before: kept, and 1 % off on every other photo
    assert "stays on PyTorch: on cat-only on astronaut.jpg: layer 0's queries differ from PyTorch's" in caplog.text
    assert set(runtimes.probes(tiny)) == {"cat.jpg", "astronaut.jpg", "coffee.jpg", "rocket.jpg", "noise", "black",
                                          "white", "checkerboard"}
    extremes = runtimes.probes(tiny)
    lo, hi = extremes["black"].amin(), extremes["white"].amax()
    assert float(extremes["noise"].amin()) == pytest.approx(float(lo), abs=0.02)  # noise spans the whole range
    assert float(extremes["noise"].amax()) == pytest.approx(float(hi), abs=0.02)


@needs_extra
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_certified_bound_is_stated_and_holds_on_every_input_of_the_set(tiny, cache, runtime):
    quick = attnviz.fast(tiny, runtime, cache=cache)
    certified = quick.runtime.certified
    assert certified.startswith("attention weights within 1e-05 of PyTorch's (q, k, token norms and output within "
                                "1e-05 of their largest value) on 8 inputs: cat.jpg, astronaut.jpg, coffee.jpg, "
                                "rocket.jpg, noise, black, white, checkerboard; largest weight difference ")
    largest = float(certified.rsplit(" ", 1)[1])
    seen = 0.0
    for x in runtimes.probes(tiny).values():
        ref, got = capture_tensor(tiny, x), capture_tensor(quick, x)
        for layer in range(ref.num_layers):
            seen = max(seen, float((ref.layer_weights(layer) - got.layer_weights(layer)).abs().max()))
    assert seen <= runtimes.TOLERANCE and seen == pytest.approx(largest, rel=0.06, abs=1e-12)


def test_token_removals_graph_is_checked_on_the_whole_set_not_on_the_cat(tiny):
    """Before, the blocks-and-head graph was checked on the cat alone: one 1 % off on every other input passed."""
    from attnviz import interventions

    network, prefix = tiny.network, tiny.num_prefix_tokens
    cat = interventions.embed(network, runtimes.probe(tiny))  # (1, N, D)
    half = (cat.shape[1] - prefix) // 2
    kept = torch.stack([torch.arange(0, 2 * half, 2), torch.arange(1, 2 * half, 2)])
    cat_sequences = [cat.numpy(), interventions.keep_tokens(cat.expand(2, -1, -1), prefix, kept).numpy()]

    def exact_on_the_cat_only(tokens: np.ndarray) -> list[np.ndarray]:
        with torch.inference_mode():
            out = interventions.readout(network, interventions.run_blocks(network, torch.from_numpy(tokens)))
        cat_alone = any(c.shape == tokens.shape and np.array_equal(c, tokens) for c in cat_sequences)
        return [out.numpy() * (1.0 if cat_alone else 1.01)]

    def exact(tokens: np.ndarray) -> list[np.ndarray]:
        with torch.inference_mode():
            return [interventions.readout(network, interventions.run_blocks(network, torch.from_numpy(tokens))).numpy()]

    assert runtimes.blocks_mismatch(tiny, exact) is None
    why = runtimes.blocks_mismatch(tiny, exact_on_the_cat_only)
    assert why is not None and why.startswith("on astronaut.jpg: the blocks' output on 17 tokens differs from PyTorch's by")
