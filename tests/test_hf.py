"""Hugging Face checkpoints: load_model("hf:<folder>") reads save_pretrained folders offline, and the
captured weights equal transformers' own eager attention (output_attentions=True) on the same input."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

import attnviz
from attnviz import ModelError
from attnviz.capture import capture_tensor

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            image_size=32, patch_size=8)
PEAK = 6.0  # × the 1/√hidden scale of a trained model's q/k weights


def tiny(arch: str):
    """A tiny random model of ``arch`` with large q and k weights so that attention is peaked
    (transformers initialises them at std 0.02, which gives near-uniform attention)."""
    torch.manual_seed(0)
    if arch.startswith("CLIP"):
        config = transformers.CLIPVisionConfig(**TINY)
    elif arch.startswith("DeiT"):
        config = transformers.DeiTConfig(**TINY, num_labels=3)
    elif arch.startswith("Dinov2WithRegisters"):
        config = transformers.Dinov2WithRegistersConfig(**TINY, num_register_tokens=4)
    elif arch.startswith("Dinov2"):
        config = transformers.Dinov2Config(**TINY)
    else:
        config = transformers.ViTConfig(**TINY, num_labels=3, id2label={0: "cat", 1: "dog", 2: "cup"},
                                        label2id={"cat": 0, "dog": 1, "cup": 2})
    network = getattr(transformers, arch)(config).eval()
    with torch.no_grad():
        for module in network.modules():
            if hasattr(module, "q_proj") and hasattr(module, "k_proj"):
                module.q_proj.weight.normal_(0.0, PEAK / TINY["hidden_size"] ** 0.5)
                module.k_proj.weight.normal_(0.0, PEAK / TINY["hidden_size"] ** 0.5)
    return network


def save(network, folder, processor: dict | None = None):
    network.save_pretrained(folder)  # safetensors
    if processor is not None:
        (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return folder


VIT_PROCESSOR = {"do_resize": True, "size": {"height": 32, "width": 32}, "resample": 2, "do_rescale": True,
                 "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
                 "image_std": [0.5, 0.5, 0.5], "image_processor_type": "ViTImageProcessor"}
CROP_PROCESSOR = {"do_resize": True, "size": {"shortest_edge": 40}, "resample": 3, "do_center_crop": True,
                  "crop_size": {"height": 32, "width": 32}, "do_rescale": True, "rescale_factor": 1 / 255,
                  "do_normalize": True, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}

ARCHS = {
    "ViTModel": 1, "ViTForImageClassification": 1, "DeiTModel": 2, "DeiTForImageClassificationWithTeacher": 2,
    "Dinov2Model": 1, "Dinov2WithRegistersModel": 5, "CLIPVisionModel": 1,
}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_hf_weights_equal_transformers_eager_attention(arch, tmp_path):
    network = tiny(arch)
    folder = save(network, tmp_path / arch, VIT_PROCESSOR)
    model = attnviz.load_model(f"hf:{folder}", device="cpu")
    assert model.num_prefix_tokens == ARCHS[arch] and model.grid == (4, 4) and model.depth == 2
    assert model.num_tokens == ARCHS[arch] + 16 and model.num_heads == 4 and model.head_dim == 8
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    cap = capture_tensor(model, x)
    eager = getattr(transformers, arch).from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = eager(pixel_values=x, output_attentions=True)
    assert len(out.attentions) == 2
    worst = max(float((cap.layer_weights(i) - out.attentions[i][0]).abs().max()) for i in range(2))
    assert worst <= 1e-5
    assert max(float(a.max()) for a in out.attentions) > 0.5  # peaked
    expected = out.logits[0] if getattr(out, "logits", None) is not None else out.pooler_output[0]
    torch.testing.assert_close(cap.output, expected, atol=1e-5, rtol=1e-5)


def test_hf_preprocessing_and_labels_come_from_the_folder(tmp_path):
    folder = save(tiny("ViTForImageClassification"), tmp_path / "vit", VIT_PROCESSOR)
    model = attnviz.load_model(f"hf:{folder}", device="cpu")
    assert model.labels == ("cat", "dog", "cup")
    cfg = model.data_config
    assert cfg["mean"] == (0.5, 0.5, 0.5) and cfg["std"] == (0.5, 0.5, 0.5)
    assert cfg["interpolation"] == "bilinear" and cfg["crop_mode"] == "squash" and cfg["crop_pct"] == 1.0
    assert model.size == 32 and model.name == f"hf:{folder}"
    # the tensor is what the folder's own image processor makes of a square photo
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    ours = model.to_input(model.view(photo))
    theirs = transformers.ViTImageProcessor(**VIT_PROCESSOR)(photo, return_tensors="pt").pixel_values
    assert float((ours - theirs).abs().max()) < 0.05  # resampling differs slightly (torchvision vs PIL)

    folder = save(tiny("Dinov2Model"), tmp_path / "dino", CROP_PROCESSOR)
    model = attnviz.load_model(f"hf:{folder}", device="cpu")
    cfg = model.data_config
    assert model.size == 32 and cfg["crop_pct"] == 32 / 40 and cfg["interpolation"] == "bicubic"
    assert cfg["crop_mode"] == "center" and cfg["std"] == (0.229, 0.224, 0.225) and model.labels is None


def test_hf_pickles_are_refused_without_being_read(tmp_path):
    folder = save(tiny("ViTModel"), tmp_path / "vit", VIT_PROCESSOR)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not even read")
    with pytest.raises(ModelError, match="pytorch_model.bin, a pickled format .* model.safetensors only"):
        attnviz.load_model(f"hf:{folder}", device="cpu")


def test_an_older_transformers_layout_is_one_sentence(monkeypatch):
    """Up to transformers 5.17 Dinov2's attention computed q and k in attention.query / attention.key, with no
    q_proj: that layout is refused in one sentence naming the version to install, never a traceback."""
    from attnviz.adapters import hf

    network = tiny("Dinov2Model")
    for module in network.modules():
        if type(module).__name__ == "Dinov2Attention":  # as 5.17 built it: the projections one module down
            module.attention = torch.nn.Module()
            module.attention.query, module.attention.key = module.q_proj, module.k_proj
            del module.q_proj, module.k_proj
    monkeypatch.setattr(hf, "transformers_version", lambda: "5.17.0")
    with pytest.raises(ModelError) as e:
        attnviz.wrap(network, "old", "random init", 32)
    assert str(e.value) == (
        "attnviz reads Dinov2Model's queries and keys from its q_proj and k_proj, which transformers has from version "
        f"{hf.MIN_TRANSFORMERS} on, and this is transformers 5.17.0; upgrade it with pip install "
        f"'transformers>={hf.MIN_TRANSFORMERS}'.")
    assert attnviz.wrap(tiny("Dinov2Model"), "new", "random init", 32).num_heads == 4  # this transformers' layout


def test_hf_unknown_folder_and_architecture(tmp_path):
    with pytest.raises(ModelError, match="no Hugging Face model 'nobody/nothing' in the local cache"):
        attnviz.load_model("hf:nobody/nothing", device="cpu")
    folder = tmp_path / "swin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["SwinModel"]}))
    with pytest.raises(ModelError, match="holds a SwinModel; attnviz reads ViT, DeiT, Dinov2"):
        attnviz.load_model(f"hf:{folder}", device="cpu")


def test_hf_from_the_local_cache_by_repo_id(tmp_path, monkeypatch):
    """A repo id resolves to its snapshot in the local Hugging Face cache, never the network."""
    hub = tmp_path / "hub"
    snapshot = hub / "models--someone--tiny-vit" / "snapshots" / ("a" * 40)
    save(tiny("ViTModel"), snapshot, VIT_PROCESSOR)
    (hub / "models--someone--tiny-vit" / "refs").mkdir()
    (hub / "models--someone--tiny-vit" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = attnviz.load_model("hf:someone/tiny-vit", device="cpu")
    assert model.provenance.startswith("Hugging Face cache someone/tiny-vit")
    assert capture_tensor(model, torch.randn(1, 3, 32, 32)).num_tokens == 17


def test_hf_model_runs_the_lesson(tmp_path):
    """The lesson's shapes and its removal test work on a Hugging Face model (no timm qkv Linear)."""
    from attnviz import lesson

    model = attnviz.load_model("hf:" + str(save(tiny("ViTForImageClassification"), tmp_path / "vit", VIT_PROCESSOR)))
    s = lesson.shapes(model)
    assert s.qkv_weight == (3 * 4 * 8, 32) and s.tokens == 17
    cap = attnviz.capture(model, Image.new("RGB", (40, 32), (200, 30, 30)))
    x = cap.input.repeat(3, 1, 1, 1)
    batch = model.adapter.forward_batch(model.network, x)  # (3, C): each row the capture's own output
    assert batch.shape == (3, 3) and torch.allclose(batch, cap.output.expand(3, -1), atol=1e-5)
    result = lesson.perturbation(model, cap, 1, "mean", steps=2, repeats=1)
    assert result.metric == "probability" and result.attended[0] == 0.0 and result.removed.tolist() == [0, 4, 8]


def test_a_folder_without_preprocessor_config_says_it_uses_imagenet_mean_and_std(tmp_path):
    folder = save(tiny("ViTModel"), tmp_path / "bare")  # no preprocessor_config.json
    model = attnviz.load_model(f"hf:{folder}", device="cpu")
    assert model.data_config["mean"] == (0.485, 0.456, 0.406) and model.data_config["std"] == (0.229, 0.224, 0.225)
    assert model.notes == ("hf:bare has no preprocessor_config.json, so attnviz normalises its photos with ImageNet's "
                           "mean (0.485, 0.456, 0.406) and standard deviation (0.229, 0.224, 0.225); if it was trained "
                           "with other values, its attention here is not what it computes on its own inputs.",)
    assert str(folder) not in model.notes[0]  # a page may show it: no path of this computer
    with_file = attnviz.load_model(f"hf:{save(tiny('ViTModel'), tmp_path / 'full', VIT_PROCESSOR)}", device="cpu")
    assert with_file.notes == ()


def test_the_page_says_a_folders_imagenet_guess_beside_the_photo_in_the_readers_language(tmp_path, monkeypatch):
    """Before, the note was the library's English sentence, shown on a zh-TW page too, and only in the research
    facts (not in the beginner's view); now it is said with the photo's own notes, from the catalogue."""
    from streamlit.testing.v1 import AppTest

    from conftest import APP

    save(tiny("ViTForImageClassification"), tmp_path / "bare")  # no preprocessor_config.json
    monkeypatch.setenv("ATTNVIZ_CHECKPOINTS", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params["model"] = "ckpt:bare"
    at.run()
    assert not at.exception and at.selectbox(key="model_choice").value == "ckpt:bare"
    said = [i.value for i in at.info if "preprocessor_config.json" in i.value]
    assert said == ["Note: hf:bare has no preprocessor_config.json, so its photos are normalised with ImageNet's mean "
                    "(0.485, 0.456, 0.406) and standard deviation (0.229, 0.224, 0.225); if it was trained with other "
                    "values, its attention here is not what it computes on its own inputs."]
    at.selectbox(key="lang").set_value("zh-TW").run()
    said = [i.value for i in at.info if "preprocessor_config.json" in i.value]
    assert said == ["注意：hf:bare 沒有 preprocessor_config.json，所以照片以 ImageNet 的平均值 (0.485, 0.456, 0.406) 與標準差 "
                    "(0.229, 0.224, 0.225) 正規化；如果它訓練時用的是其他數值，這裡的注意力就不是它在自己的輸入上算出的注意力。"]


def test_hf_without_transformers_is_one_sentence_naming_the_extra(tmp_path, monkeypatch):
    import sys

    folder = save(tiny("ViTModel"), tmp_path / "vit", VIT_PROCESSOR)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the hf extra were not installed
    with pytest.raises(attnviz.ModelError) as error:
        attnviz.load_model(f"hf:{folder}", device="cpu")
    assert str(error.value) == ("Hugging Face models (\"hf:…\") need the transformers package, which is not "
                                "installed: pip install 'attnviz[hf]'.")
