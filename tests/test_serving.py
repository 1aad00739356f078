"""What a shared server's owner allows (attnviz.serving): settings, the checkpoint folder, the budget."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from attnviz import serving
from attnviz.errors import ModelError
from attnviz.jobs import core_count


def tiny_safetensors(path: Path, metadata: dict | None = None) -> Path:
    save_file({"w": torch.zeros(2, 3)}, str(path), metadata=metadata)
    return path


def header_only_safetensors(path: Path, shapes: dict[str, list[int]]) -> Path:
    """A sparse file whose header declares tensors whose bytes are never written: counting must read
    nothing but the header (the file is as long as the tensors, and holds no data on disk)."""
    offset, header = 0, {}
    for name, shape in shapes.items():
        size = 4
        for side in shape:
            size *= side
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return path


def test_no_settings_means_no_checkpoints_no_downloads_and_the_default_budget():
    owner = serving.policy({})
    assert owner == serving.Policy(None, False, 100_000_000, core_count())
    assert serving.policy({"ATTNVIZ_CHECKPOINTS": "", "ATTNVIZ_ALLOW_DOWNLOADS": "0"}) == owner


def test_the_owner_turns_each_power_on(tmp_path):
    owner = serving.policy({"ATTNVIZ_CHECKPOINTS": str(tmp_path), "ATTNVIZ_ALLOW_DOWNLOADS": "1",
                            "ATTNVIZ_MAX_PARAMS": "1.5G", "ATTNVIZ_HEAVY_JOBS": "3"})
    assert owner == serving.Policy(tmp_path, True, 1_500_000_000, 3)
    assert serving.policy({"ATTNVIZ_MAX_PARAMS": "350M"}).max_params == 350_000_000
    assert serving.policy({"ATTNVIZ_MAX_PARAMS": "86000000"}).max_params == 86_000_000


@pytest.mark.parametrize("env, message", [
    ({"ATTNVIZ_MAX_PARAMS": "lots"}, "ATTNVIZ_MAX_PARAMS must be a number such as 100M or 1.5G; got 'lots'."),
    ({"ATTNVIZ_ALLOW_DOWNLOADS": "maybe"}, "ATTNVIZ_ALLOW_DOWNLOADS must be 1 or 0; got 'maybe'."),
])
def test_a_bad_setting_is_one_sentence(env, message):
    with pytest.raises(ValueError) as e:
        serving.policy(env)
    assert str(e.value) == message


def test_the_folder_lists_only_what_it_holds_and_can_be_loaded(tmp_path):
    folder = tmp_path / "owner"
    folder.mkdir()
    tiny_safetensors(folder / "vit_tiny_patch16_224--run1.safetensors")
    tiny_safetensors(folder / "tagged.safetensors", {"arch": "deit_small_patch16_224"})
    tiny_safetensors(folder / "no_architecture.safetensors")
    tiny_safetensors(folder / "nosucharch--x.safetensors")
    tiny_safetensors(folder / ".vit_tiny_patch16_224--hidden.safetensors")
    (folder / "model.pth").write_bytes(b"pickle")
    (folder / "notes.txt").write_text("hello")
    timm_dir = folder / "timm_export"
    timm_dir.mkdir()
    (timm_dir / "config.json").write_text(json.dumps({"architecture": "vit_small_patch16_224", "num_classes": 0}))
    tiny_safetensors(timm_dir / "model.safetensors")
    hf_dir = folder / "hf_vit"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "vit", "architectures": ["ViTModel"]}))
    tiny_safetensors(hf_dir / "model.safetensors")
    (folder / "empty_dir").mkdir()
    tiny_safetensors(tmp_path / "vit_tiny_patch16_224--outside.safetensors")  # next to the folder, not in it

    listed = serving.list_checkpoints(folder)
    assert [(c.label, c.arch, c.path) for c in listed] == [
        ("hf_vit", f"hf:{hf_dir}", hf_dir),
        ("tagged.safetensors", "deit_small_patch16_224", folder / "tagged.safetensors"),
        ("timm_export", "vit_small_patch16_224", timm_dir / "model.safetensors"),
        ("vit_tiny_patch16_224--run1.safetensors", "vit_tiny_patch16_224", folder / "vit_tiny_patch16_224--run1.safetensors"),
    ]
    assert listed[0].is_folder and listed[0].files() == (hf_dir / "config.json", hf_dir / "model.safetensors")
    assert serving.list_checkpoints(None) == () and serving.list_checkpoints(tmp_path / "missing") == ()


def test_parameters_are_counted_from_headers_alone(tmp_path):
    seven_b = header_only_safetensors(tmp_path / "big.safetensors", {"a": [4096, 4096, 400], "b": [10]})
    assert seven_b.stat().st_blocks * 512 < 100_000  # 27 GB long, a few kB on disk: only the header is real
    assert serving.checkpoint_parameters((seven_b,)) == 4096 * 4096 * 400 + 10
    with pytest.raises(serving.OverBudget) as e:
        serving.check_budget("big.safetensors", serving.checkpoint_parameters((seven_b,)), 100_000_000)
    assert str(e.value) == "big.safetensors has 6,711 million parameters, over this server's limit of 100 million."
    (tmp_path / "text.safetensors").write_text("not a checkpoint at all")
    with pytest.raises(ModelError, match=r"^text\.safetensors is not a safetensors file\.$"):
        serving.checkpoint_parameters((tmp_path / "text.safetensors",))


def test_architectures_are_counted_on_the_meta_device_exactly():
    import timm

    real = sum(p.numel() for p in timm.create_model("vit_tiny_patch16_224").parameters())
    assert serving.architecture_parameters("vit_tiny_patch16_224") == real == 5_717_416
    # a larger input only adds position embeddings: (28² − 14²) × 192 more
    assert serving.architecture_parameters("vit_tiny_patch16_224", 448) == real + (28 * 28 - 14 * 14) * 192


GIANT_SCRIPT = """
import time
from attnviz import serving

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

serving.architecture_parameters("vit_tiny_patch16_224")  # imports torch and timm first
for arch in ("vit_giant_patch14_224", "vit_7b_patch16_dinov3", "vit_huge_patch14_224"):
    before, start = rss_mb(), time.perf_counter()
    try:
        serving.check_budget(arch, serving.architecture_parameters(arch), serving.DEFAULT_MAX_PARAMS)
    except serving.OverBudget as e:
        print(f"{{arch}}|{{time.perf_counter() - start:.3f}}|{{rss_mb() - before:.1f}}|{{e}}")
"""


def test_giant_architectures_are_refused_before_any_memory_grows():
    run = subprocess.run([sys.executable, "-c", GIANT_SCRIPT.format()], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split("|") for line in run.stdout.strip().splitlines()]
    print("\n".join(f"{arch}: refused in {s} s, resident memory +{mb} MB" for arch, s, mb, _ in rows))
    assert [row[0] for row in rows] == ["vit_giant_patch14_224", "vit_7b_patch16_dinov3", "vit_huge_patch14_224"]
    for arch, seconds, growth, message in rows:
        assert float(growth) < 100, (arch, seconds, growth)  # a ViT-g alone would be 4 GB in float32
    assert rows[0][3] == ("vit_giant_patch14_224 has 1,013 million parameters, over this server's limit of "
                          "100 million.")
    assert rows[1][3].startswith("vit_7b_patch16_dinov3 has 6,716 million parameters")
