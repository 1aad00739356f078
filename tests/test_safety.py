"""Safety: no unpickling, verified weights, uploads kept in memory, XSRF on, no surprise network traffic."""
from __future__ import annotations

import io
import os
import pickle
import re
import secrets
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from PIL import Image, PngImagePlugin

import attnviz
from attnviz import offline
from attnviz.images import MAX_BYTES

from conftest import APP, ROOT, holds, written_since

CODE = [*ROOT.glob("*.py"), *(ROOT / "attnviz").rglob("*.py"), *(ROOT / "attnviz_app").rglob("*.py")]


def test_no_pickle_loading_anywhere_in_the_app():
    assert len(CODE) > 5
    for path in CODE:
        source = path.read_text()
        for call in re.finditer(r"torch\.load\((.*)\)", source):
            assert "weights_only=True" in call.group(1), f"{path}: {call.group(0)}"
        assert not re.search(r"^\s*(import pickle|from pickle|import dill|import joblib|import cloudpickle)", source,
                             re.M), path
        assert not re.search(r"pickle\.loads?\(|allow_pickle\s*=\s*True|torch\.jit\.load", source), path


class _Payload:
    """Unpickling this creates a file: proof that someone ran code from a checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("suffix", [".pth", ".bin", ".pt", ".ckpt", ".pkl", ""])
def test_load_model_refuses_pickled_checkpoints(tmp_path, suffix):
    marker = tmp_path / "code_ran"
    path = tmp_path / f"evil{suffix}"
    path.write_bytes(pickle.dumps({"state": _Payload(marker)}))
    with pytest.raises(attnviz.ModelError, match=r"^Only \.safetensors checkpoints are accepted"):
        attnviz.load_model("vit_small_patch16_224", checkpoint=path, device="cpu")
    assert not marker.exists()


def test_a_pickle_renamed_safetensors_is_not_unpickled(tmp_path):
    marker = tmp_path / "code_ran"
    path = tmp_path / "evil.safetensors"
    path.write_bytes(pickle.dumps({"state": _Payload(marker)}))
    with pytest.raises(attnviz.ModelError, match=r"^evil\.safetensors is not a safetensors file\.$"):
        attnviz.load_model("vit_tiny_patch16_224", checkpoint=path, device="cpu")
    assert not marker.exists()


def test_offline_weights_sha256_is_checked_before_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    assert offline.sha256(offline.onnx_path()) == offline.ONNX_SHA256  # the real file is the expected one
    monkeypatch.setattr(offline, "ONNX_SHA256", "0" * 64)
    converted = []
    monkeypatch.setattr(offline, "convert", lambda path: converted.append(path) or {})
    with pytest.raises(offline.WeightsError, match=r"does not have the expected sha256; refusing to load it"):
        attnviz.load_model(device="cpu")
    assert converted == []  # refused before conversion
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing half-written
    assert (Path.home() / ".cache" / "attnviz").exists()  # the real cache was never touched


def test_xsrf_protection_stays_on():
    config = tomllib.loads((ROOT / "attnviz_app" / "config.toml").read_text())
    assert (ROOT / ".streamlit" / "config.toml").resolve() == (ROOT / "attnviz_app" / "config.toml")  # one file
    assert config["server"]["enableXsrfProtection"] is True
    assert config["server"].get("enableCORS", True) is True
    assert config["server"]["maxUploadSize"] * 2**20 == MAX_BYTES
    launchers = [*ROOT.glob("Makefile"), *ROOT.glob("*.sh"), *ROOT.glob("scripts/*"), *ROOT.glob("Dockerfile*"),
                 ROOT / "tests" / "serve.py"]
    for path in launchers:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not re.search(r"enableXsrfProtection[ =]+false|enableCORS[ =]+false", text, re.I), path


def test_uncached_hub_model_without_network_fails_fast_and_clearly(tmp_path):
    """In a child process whose hub endpoint is a closed local port and whose HF cache is empty."""
    script = (
        "import time, attnviz\n"
        "start = time.perf_counter()\n"
        "try:\n"
        "    attnviz.load_model('deit_small_patch16_224.fb_in1k', device='cpu')\n"
        "except attnviz.ModelError as e:\n"
        "    print(f'{time.perf_counter() - start:.2f}|{e}')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_PROXY": "*", "http_proxy": "", "https_proxy": ""}
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=90)  # a hang guard: without the short probe timm waited 53 s here
    seconds, message = run.stdout.strip().split("|", 1)
    print(f"uncached hub model refused after {seconds} s: {message}")
    assert message == ("deit_small_patch16_224.fb_in1k is not in the local cache and the model hub cannot be "
                       "reached.")
    assert not any((tmp_path / "hf").rglob("*.safetensors"))



def test_default_model_needs_no_network(connections, cat):
    model = attnviz.load_model(device="cpu")
    attnviz.capture(model, cat)
    assert connections == []


def marked_png(token: str) -> bytes:
    """A small PNG carrying ``token`` in a text chunk, so any copy of the upload can be found on disk."""
    info = PngImagePlugin.PngInfo()
    info.add_text("upload-token", token)
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 120, 40)).save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


def test_the_scan_for_a_written_upload_reads_regular_files_only(tmp_path):
    """Another worker's hostile-file test can make a FIFO in the shared temporary folder while the scan below runs: it
    was read, and the read waited for a writer until pytest-timeout ended the test (600 s)."""
    since = time.time() - 1
    (tmp_path / "kept.bin").write_bytes(b"a token")
    os.mkfifo(tmp_path / "run.json")
    (tmp_path / "link.bin").symlink_to(tmp_path / "kept.bin")
    assert sorted(p.name for p in written_since(tmp_path, since)) == ["kept.bin", "link.bin", "run.json"]
    assert [p.name for p in written_since(tmp_path, since) if holds(p, b"token")] == ["kept.bin"]
    assert not holds(tmp_path / "gone.bin", b"token")  # removed since it was listed


def test_uploads_stay_in_memory_and_the_page_makes_no_network_calls(connections, tmp_path):
    import tempfile

    from streamlit.testing.v1 import AppTest

    token = secrets.token_hex(16)
    data = marked_png(token)
    name = f"upload_{token}.png"
    status_before = subprocess.run(["git", "status", "--porcelain", "-uall"], cwd=ROOT, capture_output=True,
                                   text=True).stdout
    since = time.time() - 1
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.radio(key="source").set_value("upload").run()
    at.file_uploader(key="upload").set_value((name, data, "image/png"))
    at.run()
    assert not at.exception and not at.error and at.image
    status_after = subprocess.run(["git", "status", "--porcelain", "-uall"], cwd=ROOT, capture_output=True,
                                  text=True).stdout
    assert token not in status_after
    new_lines = set(status_after.splitlines()) - set(status_before.splitlines())
    assert not any(token in line or "upload" in line.lower() for line in new_lines)
    for folder in (ROOT, Path(tempfile.gettempdir())):
        for path in written_since(folder, since):
            assert not holds(path, token.encode()), f"the upload was written to {path}"
    assert connections == []


def test_caches_have_entry_bounds():
    from attnviz_app import ui

    for cached in (ui.cached_model, ui.cached_capture, ui.checked_image):
        assert cached._info.max_entries is not None and cached._info.max_entries <= 32, cached.__name__


def test_decoded_image_cache_is_bounded_in_bytes():
    from attnviz_app import ui

    from make_corpus import encode, photo

    data = encode(photo(6000, 4000), "JPEG", quality=70)  # a 24-megapixel phone photo
    model = attnviz.load_model(device="cpu")
    checked = ui.checked_image.__wrapped__(ui.digest(data), 0, "big.jpg", data, model)
    per_entry = checked.image.width * checked.image.height * 3
    assert per_entry * ui.checked_image._info.max_entries <= 512 * 2**20
