"""Every family's capture through what the page, the export and the live camera do with it (issue #22):
each layer's summary map, a query's map and its window outline at the keys' grid, the Stage view's
sentences in both languages, an export that reads back to the same weights, and one live frame.

The numbers themselves are checked against the eager softmax in tests/test_zoo.py; here the point is
that no family's layout (windows, pooled keys, class attention, blends) breaks a consumer of captures.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_zoo import SMALL_BUILDS

STAGED = [b for b in SMALL_BUILDS if b[0] not in ("vision_transformer_hybrid", "vitamin", "beit")]


def small_model(name: str, kwargs: dict, size: int):
    import timm

    import attnviz

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    return attnviz.wrap(network, name, "random init", size)


@pytest.mark.parametrize("module, name, kwargs, size", STAGED, ids=[f"{b[1]}-{b[3]}" for b in STAGED])
def test_every_layer_draws_and_exports_and_streams(module, name, kwargs, size, tmp_path):
    from PIL import Image

    import attnviz
    from attnviz.capture import capture_tensor
    from attnviz.export import load_capture, save_capture
    import streamlit as st

    from attnviz import i18n
    from attnviz.live import LiveSettings, heatmap_frame
    from attnviz_app.views.stages import block_label, intro

    model = small_model(name, kwargs, size)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    cap = capture_tensor(model, x)
    assert isinstance(cap, attnviz.Capture)  # one type for every model (EfficientFormer V1: one grid throughout)
    for layer in range(cap.num_layers):
        lay = cap.layout(layer)
        summary = cap.summary_map(layer, "mean")
        assert summary.shape == lay.keys_grid and np.isfinite(summary).all()
        query = int(lay.windows[0, 0])
        row = cap.row(layer, "mean", query)  # over every key, prefix tokens too
        assert row.shape == (lay.num_keys,) and abs(row.sum() - 1) < 1e-4
        assert cap.query_map(layer, 0, query).shape == lay.keys_grid
        inside = cap.window_mask(layer, query)
        assert inside.shape == lay.keys_grid and inside.any()
        # outside the query's window its map is exactly 0
        assert cap.query_map(layer, "max", query)[~inside].max(initial=0) == 0
    try:
        for lang in i18n.LANGUAGES:
            st.session_state["lang"] = lang  # outside a page run: Streamlit's own session state stand-in
            text = intro(model, cap)
            labels = [block_label(cap.layout(i), i + 1) for i in range(cap.num_layers)]
            assert name in text and ("階段" in text) == (lang == "zh-TW")  # the model, in the reader's language
            assert "{" not in text and all(labels)
    finally:
        st.session_state["lang"] = None
    path = save_capture(tmp_path / "cap.npz", cap, format="qk")
    back = load_capture(path)
    for layer in (0, cap.num_layers - 1):
        assert torch.equal(back.layer_weights(layer), cap.layer_weights(layer))
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 255, (size + 10, size, 3), dtype=np.uint8))
    frame = heatmap_frame(photo, LiveSettings(model, layer=cap.num_layers - 1))
    assert frame.cls_map.shape == cap.layout(cap.num_layers - 1).keys_grid


@pytest.mark.parametrize("arch", ["levit_128s", "shvit_s1"])
def test_a_checkpoint_of_a_family_without_patch_embed_loads_at_its_own_size(arch, tmp_path):
    """The page's "model's own size" (size None) is timm's config input size for families without a timm
    PatchEmbed, not a refusal of "None" px."""
    import timm
    from safetensors.torch import save_file

    import attnviz

    torch.manual_seed(0)
    network = timm.create_model(arch, pretrained=False, num_classes=3)
    path = tmp_path / f"{arch}--random.safetensors"
    save_file({k: v.contiguous() for k, v in network.state_dict().items()}, str(path))
    model = attnviz.load_model(arch, None, checkpoint=path)
    assert model.size == network.pretrained_cfg["input_size"][-1] == 224
    assert model.adapter.layouts is not None
    from PIL import Image

    cap = attnviz.capture(model, Image.new("RGB", (300, 240), (120, 80, 40)))
    assert cap.output.shape == (3,)  # the file's 3-class classifier


def test_a_windowed_layer_in_window_order_is_block_diagonal():
    """The Stage view's matrix: queries and keys listed window by window, each window a block on the
    diagonal, exactly 0 between windows, and every query's row sums to 1."""
    from attnviz.capture import capture_tensor
    from attnviz_app.views.stages import pooled
    from tests.test_zoo import SMALL_SWIN

    model = small_model("swin_tiny_patch4_window7_224", SMALL_SWIN | {"img_size": 112}, 112)
    cap = capture_tensor(model, torch.randn(1, 3, 112, 112, generator=torch.Generator().manual_seed(1)))
    lay = cap.layout(1)  # shifted windows: the window order is not the raster order
    weights = cap.ordered_weights(1, 0)
    t = lay.windows.shape[1]
    inside = np.kron(np.eye(lay.num_windows, dtype=bool), np.ones((t, t), dtype=bool))
    assert weights.shape == (784, 784) and weights[~inside].max() == 0 and (weights[inside] > 0).all()
    np.testing.assert_allclose(weights.sum(1), 1, atol=1e-5)
    rows, cols = cap.window_order(1)
    full = cap.layer_weights(1)[0].numpy()  # raster order
    np.testing.assert_array_equal(weights, full[rows.numpy()][:, cols.numpy()])
    shown, k = pooled(weights, 200)
    assert k == 4 and shown.shape == (196, 196) and shown[0, 0] == weights[:4, :4].max()
