"""DaViT (issue #22): its window-attention blocks are read; its channel-attention blocks (a channels ×
channels softmax) are dropped from the zoo reference by module, not read, and the page says why in one
sentence, in the stages intro."""
from __future__ import annotations

import pytest

from tests.test_zoo_class_tokens import small_capture

# Windows of 4 on a 32 grid (64 windows), 16 (16), 8 (4) and one 4 × 4 window
SMALL_DAVIT = {"depths": (1, 1, 1, 1), "embed_dims": (32, 64, 96, 128), "num_heads": (1, 2, 3, 4), "window_size": 4}


def test_davit_windows_are_timms_window_partition_and_channel_attention_is_dropped():
    import torch
    from timm.models.davit import ChannelAttention, window_partition

    from tests.zoo import eager_softmaxes

    network, x, cap = small_capture("davit_tiny", SMALL_DAVIT, 128, peaked=True)
    assert cap.stages == ((0,), (1,), (2,), (3,)) and cap.note == "stages.unread_davit"
    for layer, (grid, patch) in enumerate([((32, 32), 4), ((16, 16), 8), ((8, 8), 16), ((4, 4), 32)]):
        lay = cap.layout(layer)
        assert lay.grid == grid and lay.patch == patch and lay.window == (4, 4)
        # SpatialBlock: x.view(B, H, W, C) (raster order of the NCHW map), then timm's window_partition
        index = torch.arange(grid[0] * grid[1]).reshape(1, *grid, 1)
        assert torch.equal(lay.windows, window_partition(index, (4, 4)).reshape(-1, 16))
    dropped = []
    reference = eager_softmaxes(network, x, "davit", dropped)
    channels = [m for m in network.modules() if type(m) is ChannelAttention]
    assert len(dropped) == len(channels) == 4  # one channels × channels softmax per ChannelBlock
    assert [tuple(d.shape) for d in dropped] == [(1, h, 32, 32) for h in (1, 2, 3, 4)]
    assert [tuple(r.shape) for r in reference] == [(64, 1, 16, 16), (16, 2, 16, 16), (4, 3, 16, 16), (1, 4, 16, 16)]


@pytest.mark.parametrize("size, sentence", [
    (240, "The input size must be a multiple of 32 px, the side of DaVit's tokens at its last stage (it pads other "
          "sizes with pixels that are not in the photo); 240 px is not."),
    (256, "At 256 px, stage 1 of DaVit has a 64 × 64 token grid that does not divide into 7 × 7 windows, so the "
          "model pads it with tokens that are not in the photo; attnviz refuses that size rather than show them "
          "(use a size where every stage divides)."),
])
def test_davit_refuses_sizes_it_pads(size, sentence):
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model("davit_tiny", pretrained=False, depths=(1, 1, 1, 1)).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "davit", "random init", size)
    assert str(error.value) == sentence


@pytest.mark.parametrize("name, kwargs, size, key", [
    ("davit_tiny", SMALL_DAVIT, 128, "stages.unread_davit"),
    ("xcit_nano_12_p8_224", {"depth": 1}, 64, "stages.unread_xcit"),
    ("volo_d1_224", {"img_size": 64}, 64, "stages.unread_volo"),
])
def test_the_stages_intro_says_why_the_other_layers_are_not_drawn(name, kwargs, size, key):
    from types import SimpleNamespace

    import streamlit as st

    from attnviz import i18n
    from attnviz_app.views.stages import intro

    _, _, cap = small_capture(name, kwargs, size)
    for lang in i18n.LANGUAGES:
        st.session_state["lang"] = lang
        sentence = i18n.text(lang, key)
        assert sentence and sentence in intro(SimpleNamespace(public_name=name), cap)
    st.session_state["lang"] = None
