"""MViTv2 and SAM's ViT (issue #22): pooled queries against pooled keys (grids from the model's own
pooling convolutions), SAM's windows by timm's window_partition or global, and sizes that would pad refused."""
from __future__ import annotations

import pytest

from tests.test_zoo import SMALL_SAM
from tests.zoo import one_sentence


def small_capture(name: str, size: int, **kwargs):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, img_size=size, **kwargs).eval()
    model = attnviz.wrap(network, name, "random init", size)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    return network, x, capture_tensor(model, x)


@pytest.mark.parametrize("name", ["mvitv2_tiny", "mvitv2_small_cls"])
def test_mvitv2_layers_are_every_pooled_query_against_every_pooled_key(name):
    import torch

    network, x, cap = small_capture(name, 64)
    # the model's own pooled grids, read from its pooling convolutions' outputs on the same image
    grids = []
    hooks = [m.register_forward_hook(lambda _m, _i, out, g=grids, kind=kind: g.append((kind, tuple(out.shape[-2:]))))
             for block in (b for stage in network.stages for b in stage.blocks)
             for kind, m in (("q", block.attn.pool_q), ("k", block.attn.pool_k))]
    with torch.no_grad():
        network(x)
    for h in hooks:
        h.remove()
    q_grids, k_grids = [g for kind, g in grids if kind == "q"], [g for kind, g in grids if kind == "k"]
    cls = int(name.endswith("_cls"))
    assert cap.num_layers == len(q_grids) == sum(len(stage.blocks) for stage in network.stages)
    for layer in range(cap.num_layers):
        lay = cap.layout(layer)
        assert lay.grid == q_grids[layer] and lay.keys_grid == k_grids[layer]
        assert lay.prefix == lay.num_key_prefix == cls and lay.class_token == bool(cls)
        # one window: every query token (class token first, then the pooled grid in raster order) against every key
        assert lay.windows.tolist() == [list(range(cls + q_grids[layer][0] * q_grids[layer][1]))]
        assert lay.keys.tolist() == [list(range(cls + k_grids[layer][0] * k_grids[layer][1]))]
        assert lay.patch == 64 // lay.grid[0]
    assert [cap.layout(i).grid for i in cap.stages[0]] == [(16, 16)] and cap.layout(0).keys_grid == (4, 4)
    assert cap.layout(cap.stages[-1][0]).grid == (2, 2)
    assert cap.summary == ("cls" if cls else "mean_received")
    # a row of the whole-image matrix is a distribution over the keys (their grid, not the queries')
    m = cap.query_map(3, 0, cls)
    assert m.shape == cap.layout(3).keys_grid and abs(m.sum() + cap.row(3, 0, cls)[:cls].sum() - 1) < 1e-5


def test_sam_layers_are_timm_window_partition_or_global():
    import torch
    from timm.models.vision_transformer_sam import window_partition

    network, _, cap = small_capture("samvit_base_patch16", 448, **SMALL_SAM)
    assert cap.num_layers == 3 and all(cap.layout(i).grid == (28, 28) for i in range(3))
    tokens = torch.arange(28 * 28, dtype=torch.float64).reshape(1, 28, 28, 1)
    for layer, block in enumerate(network.blocks):
        lay = cap.layout(layer)
        if block.window_size:  # the model's own partition of an arange grid: window w's tokens, in its order
            windows, padded = window_partition(tokens, block.window_size)
            assert padded == (28, 28)
            assert lay.windows.tolist() == windows.reshape(windows.shape[0], -1).long().tolist()
            assert lay.num_windows == 4 and lay.window == (14, 14)
        else:
            assert lay.windows.tolist() == [list(range(28 * 28))]
        assert lay.keys is lay.windows and lay.prefix == 0 and not lay.class_token
    assert [bool(b.window_size) for b in network.blocks] == [True, False, True]


def test_sam_refuses_sizes_whose_windows_need_padding():
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model("samvit_base_patch16", pretrained=False, **SMALL_SAM, img_size=1024).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "samvit_base_patch16", "random init", 1024)
    assert str(error.value) == (
        "At 1024 px, VisionTransformerSAM has a 64 × 64 token grid that does not divide into its 14 × 14 windows, "
        "so the model pads it with tokens that are not in the photo (and gives them weight); attnviz refuses that "
        "size rather than show them (use a multiple of 224 px).")
    assert one_sentence(str(error.value))
