"""A Swin checkpoint from the owner's folder on the page (issue #22): Stage and Block instead of Layer,
each stage's grid, windows outlined, a click makes a patch the query; both languages."""
from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import serving
from conftest import APP

ARCH = "swin_tiny_patch4_window7_224"
CHOICE = f"ckpt:{ARCH}--random.safetensors"


@pytest.fixture(scope="module")
def swin_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("owner")
    torch.manual_seed(0)
    save_file(timm.create_model(ARCH, pretrained=False, num_classes=3).state_dict(), str(folder / f"{ARCH}--random.safetensors"))
    return folder


@pytest.fixture
def owner(swin_folder, monkeypatch):
    for name in (serving.ENV_DOWNLOADS, serving.ENV_MAX_PARAMS, serving.ENV_HEAVY_JOBS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(serving.ENV_CHECKPOINTS, str(swin_folder))
    return swin_folder


def test_a_swin_checkpoint_shows_stages_blocks_and_windows_in_both_languages(owner):
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = "en"
    at.run()
    at.selectbox(key="model_choice").set_value(CHOICE).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    stage = at.selectbox(key="stage")
    assert len(stage.options) == 4 and stage.value == 3
    assert at.selectbox(key="stage_block").value == 1  # the last block of stage 4
    assert [s.key for s in at.slider] == ["alpha"]  # no Layer slider: Stage and Block replace it
    stage.set_value(0).run()
    at.selectbox(key="stage_block").set_value(1).run()  # stage 1, block 2: shifted windows
    assert not at.exception
    info = " ".join(i.value for i in at.info)
    assert "4 stages of windowed attention" in info and "56 × 56, 28 × 28, 14 × 14, 7 × 7" in info
    assert "Stage 1, block 2, mean of all heads: mean attention each patch receives within its window" in " ".join(
        h.value for h in at.subheader)
    captions = " ".join(c.value for c in at.caption)
    assert "averaged over the 49 patches of its window" in captions
    assert "attention cannot be multiplied through the layers" in captions
    at.radio(key="stage_show").set_value("query").run()
    assert not at.exception
    assert "row 29, column 29" in " ".join(h.value for h in at.subheader)  # the middle of the 56 × 56 grid
    assert "shifted by 3 × 3 tokens" in " ".join(c.value for c in at.caption)
    at.selectbox(key="lang").set_value("zh-TW").run()
    assert not at.exception
    assert at.selectbox(key="stage").label == "階段" and at.selectbox(key="stage_block").label == "區塊"
    assert "第 29 列、第 29 行" in " ".join(h.value for h in at.subheader)
    assert "平移了 3 × 3 個 token" in " ".join(c.value for c in at.caption)


def test_the_page_numbers_are_the_library_numbers(owner):
    """What the page states for the query (its self-weight) is this capture's number, from the library."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = "en"
    at.run()
    at.selectbox(key="model_choice").set_value(CHOICE).run()
    at.selectbox(key="stage").set_value(1).run()
    at.selectbox(key="stage_block").set_value(1).run()
    at.session_state["stage_query"] = (3, 5)
    at.radio(key="stage_show").set_value("query").run()
    line = next(m.value for m in at.markdown if "attention to itself" in m.value)
    model = attnviz.load_model(ARCH, checkpoint=owner / f"{ARCH}--random.safetensors", device="cpu")
    from attnviz.photos import sample
    from PIL import Image

    cap = attnviz.capture(model, Image.open(sample(at.selectbox(key="sample").value)))
    layer = cap.layer_of(1, 1)
    m = cap.query_map(layer, "mean", 3 * 28 + 5)
    assert f"**{m[3, 5]:.4f}**" in line and f"**{np.max(m):.4f}**" in line
