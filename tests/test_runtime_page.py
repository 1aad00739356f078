"""The owner's runtime (ATTNVIZ_RUNTIME) on the page: parsed in one sentence, switched on only where exact,
said in the facts panel, and the same model object for every capture the server makes."""
from __future__ import annotations

import logging

import pytest
import torch
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import runtimes, serving
from conftest import APP, tiny_vit


@pytest.mark.parametrize("raw, runtime", [("", "auto"), ("pytorch", "pytorch"), (" OpenVINO ", "openvino"),
                                          ("onnxruntime", "onnxruntime")])
def test_the_owner_names_the_runtime(raw, runtime):
    assert serving.policy({"ATTNVIZ_RUNTIME": raw}).runtime == runtime


def test_a_runtime_attnviz_does_not_know_is_one_sentence():
    with pytest.raises(ValueError) as e:
        serving.policy({"ATTNVIZ_RUNTIME": "tensorrt"})
    assert str(e.value) == "ATTNVIZ_RUNTIME must be one of auto, pytorch, onnxruntime, openvino; got 'tensorrt'."


def test_pytorch_leaves_the_model_as_it_is():
    model = tiny_vit()
    assert runtimes.on_runtime(model, "pytorch") is model


def test_auto_takes_the_first_installed_runtime_and_is_exact(tmp_path):
    model = tiny_vit()
    fast = runtimes.on_runtime(model, "auto", threads=1, cache=tmp_path)
    assert runtimes.installed() == ("onnxruntime", "openvino")  # both are installed here (requirements-dev.txt)
    assert fast.runtime is not None and fast.runtime.name == "onnxruntime" and fast.runtime.threads == 1
    x = torch.rand(1, 3, 32, 32)
    ours, reference = attnviz.capture_tensor(fast, x), attnviz.capture_tensor(model, x)
    assert torch.allclose(ours.layer_weights(1), reference.layer_weights(1), atol=1e-5)


def test_auto_with_no_runtime_installed_is_pytorch_without_a_word(monkeypatch, caplog):
    model = tiny_vit()
    monkeypatch.setattr(runtimes, "installed", lambda: ())
    with caplog.at_level(logging.INFO, logger="attnviz.runtimes"):
        assert runtimes.on_runtime(model, "auto") is model
    assert caplog.records == []  # the extra is optional: no runtime is the ordinary case


def test_a_named_runtime_that_is_not_installed_stays_on_pytorch_with_one_log_line(monkeypatch, caplog):
    model = tiny_vit()
    monkeypatch.setattr(runtimes, "installed", lambda: ("onnxruntime",))
    with caplog.at_level(logging.WARNING, logger="attnviz.runtimes"):
        kept = runtimes.on_runtime(model, "openvino")  # named by the owner, not installed
    assert kept is model and kept.runtime is None
    assert [r.getMessage() for r in caplog.records] == [
        "tiny stays on PyTorch: the openvino runtime is not installed (pip install 'attnviz[fast]')"]


@pytest.mark.parametrize("runtime, said", [
    # the set it was checked on, not a promise for every photo (before: "its q and k equal PyTorch's within 1e-5")
    ("openvino", "OpenVINO (checked at load on 8 inputs, 4 photos, noise, black, white and a checkerboard: every "
                 "attention weight within 1e-5 of PyTorch's)"),
    ("onnxruntime", "ONNX Runtime (checked at load on 8 inputs, 4 photos, noise, black, white and a checkerboard: "
                    "every attention weight within 1e-5 of PyTorch's)"),
    ("pytorch", "on CPU, PyTorch\n"),
])
def test_the_page_captures_on_the_owners_runtime_and_says_so(runtime, said, monkeypatch, tmp_path):
    from attnviz_app import ui

    monkeypatch.setenv("ATTNVIZ_RUNTIME", runtime)
    monkeypatch.setattr(runtimes, "default_cache", lambda: tmp_path)
    at = AppTest.from_file(str(APP), default_timeout=180).run()
    assert not at.exception and not at.error
    facts = next(m.value for m in at.markdown if "**Tokens:**" in m.value)
    assert said in facts + "\n"
    model = ui.cached_model(None, 196, None, None, "cpu", runtime)  # the page's cache: the model it captured with
    assert (model.runtime.name if model.runtime is not None else "pytorch") == runtime
    if runtime != "pytorch":
        assert list(tmp_path.glob("capture-*.onnx"))  # the page's model was exported and checked, not assumed


def test_a_model_with_stages_stays_on_pytorch_with_one_log_line(tmp_path, caplog):
    from test_zoo import SMALL_BUILDS
    from test_zoo_views import small_model

    _, name, kwargs, size = next(b for b in SMALL_BUILDS if b[1].startswith("swin_tiny"))
    model = small_model(name, kwargs, size)
    with caplog.at_level(logging.WARNING, logger="attnviz.runtimes"):
        kept = runtimes.on_runtime(model, "auto", threads=1, cache=tmp_path)
    assert kept.runtime is None and not list(tmp_path.iterdir())  # refused before any export
    assert [r.getMessage() for r in caplog.records] == [
        f"{name} stays on PyTorch: the onnxruntime runtime runs models without stages and windows only"]
