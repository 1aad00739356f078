"""The zoo walk (issue #22): every timm vision-transformer family is read exactly (≤ 1e-5 against its
own eager softmax, every layer and head, attention peaked) or refused in one true sentence; none crashes.

The fast tests build a few families small; ``--slow`` walks the smallest two members of every family
in :data:`tests.zoo.FAMILIES` at their own input size (a few minutes on two cores).
"""
from __future__ import annotations

import pytest

from tests.zoo import FAMILIES, members, one_sentence, walk_one


def check(result) -> None:
    has_attention = FAMILIES[result.module][1]
    if result.status == "exact":
        assert result.exact, result
        return
    sentence = result.detail
    assert one_sentence(sentence), sentence
    if has_attention:  # a vision transformer is never "not a Vision Transformer"
        assert "not a Vision Transformer" not in sentence, sentence
    else:
        assert "has no attention between patches" in sentence, sentence


SMALL_SWIN = {"depths": (2, 2), "embed_dim": 32, "num_heads": (2, 4)}
SMALL_SAM = {"depth": 3, "embed_dim": 64, "num_heads": 4, "global_attn_indexes": (1,)}  # windowed, global, windowed


# ---- fast: small builds of a few families --------------------------------------------------------

@pytest.mark.parametrize("module, name, kwargs, size", [
    ("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224", {"depth": 2}, 224),
    ("vitamin", "vitamin_small_224", {"depth": 2}, 224),
    ("beit", "beit_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("beit", "beitv2_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("swin_transformer", "swin_tiny_patch4_window7_224", SMALL_SWIN | {"img_size": 112}, 112),
    ("swin_transformer_v2", "swinv2_tiny_window8_256", SMALL_SWIN | {"img_size": 128}, 128),
    ("mvitv2", "mvitv2_tiny", {"img_size": 64}, 64),
    ("vision_transformer_sam", "samvit_base_patch16_224", SMALL_SAM | {"img_size": 448}, 448),
])
def test_small_members_are_exact_when_peaked(module, name, kwargs, size):
    result = walk_one(module, name, kwargs, size)
    assert result.status == "exact", result.detail
    check(result)
    assert result.peak > 0.5  # peaked for real: some head puts over half its weight on one key


def swin_capture(name: str, size: int):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, img_size=size, **SMALL_SWIN).eval()
    model = attnviz.wrap(network, name, "random init", size)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    return network, capture_tensor(model, x)


def test_swin_layers_are_stage_and_block_with_their_own_grid_and_windows():
    import numpy as np

    network, cap = swin_capture("swin_tiny_patch4_window7_224", 112)
    assert cap.stages == ((0, 1), (2, 3))
    assert [cap.grid(i) for i in range(4)] == [(28, 28), (28, 28), (14, 14), (14, 14)]
    assert [cap.layout(i).patch for i in range(4)] == [4, 4, 8, 8]
    assert [cap.num_heads(i) for i in range(4)] == [2, 2, 4, 4]
    # the window partition, by a plain loop: window (a, b), row (i, j) is the token the shift brought there
    for layer in range(4):
        lay = cap.layout(layer)
        (h, w), (wh, ww), (sh, sw) = lay.grid, lay.window, lay.shift
        expected = [[((a * wh + i + sh) % h) * w + (b * ww + j + sw) % w for i in range(wh) for j in range(ww)]
                    for a in range(h // wh) for b in range(w // ww)]
        assert lay.windows.tolist() == expected
    assert cap.layout(0).shift == (0, 0) and cap.layout(1).shift == (3, 3)
    # a query's map is zero outside its (shifted) window and sums to 1 inside it
    lay, query = cap.layout(1), 0  # the top-left token: its shifted window wraps around both edges
    m = cap.query_map(1, 0, query)
    inside = np.zeros(lay.num_tokens, bool)
    inside[lay.windows[lay.window_of(query)[0]].numpy()] = True
    inside = inside.reshape(lay.grid)
    assert m[~inside].max() == 0 and abs(m[inside].sum() - 1) < 1e-6
    assert inside[0, 0] and inside[-1, -1] and inside.sum() == 49  # wrapped: corners of the grid
    # the row agrees with the whole-image matrix, and the summary is the mean received within windows
    full = cap.layer_weights(1)  # (H, N, N)
    np.testing.assert_allclose(cap.row(1, 0, 5), full[0, 5].numpy(), atol=1e-7)
    received = full.mean(0).sum(0) / 49  # each key's column: T queries of its window
    np.testing.assert_allclose(cap.summary_map(1, "mean").reshape(-1), received.numpy(), atol=1e-6)
    assert cap.summary == "mean_received" and not cap.has_class_token


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
    assert [cap.grid(i) for i in cap.stages[0]] == [(16, 16)] and cap.layout(0).keys_grid == (4, 4)
    assert cap.grid(cap.stages[-1][0]) == (2, 2)
    assert cap.summary == ("cls" if cls else "mean_received")
    # a row of the whole-image matrix is a distribution over the keys (their grid, not the queries')
    m = cap.query_map(3, 0, cls)
    assert m.shape == cap.layout(3).keys_grid and abs(m.sum() + cap.row(3, 0, cls)[:cls].sum() - 1) < 1e-5


def test_sam_layers_are_timm_window_partition_or_global():
    import torch
    from timm.models.vision_transformer_sam import window_partition

    network, _, cap = small_capture("samvit_base_patch16", 448, **SMALL_SAM)
    assert cap.num_layers == 3 and all(cap.grid(i) == (28, 28) for i in range(3))
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


@pytest.mark.parametrize("module, name, kwargs, sentence", [
    ("convnext", "convnext_zepto_rms", {}, "ConvNeXt has no attention between patches (it mixes them with "
     "convolutions), so there are no attention weights to show."),
    ("swiftformer", "swiftformer_xs", {}, "SwiftFormer has no attention between patches (it mixes them with "
     "additive attention, which has no softmax between tokens), so there are no attention weights to show."),
    ("cait", "cait_xxs24_224", {"depth": 2, "depth_token_only": 1}, "Cait has talking-heads attention (the heads "
     "are mixed before and after the softmax), which attnviz cannot reproduce exactly yet, so it refuses it "
     "rather than show attention weights that may be wrong."),
    ("fastvit", "fastvit_t8", {}, "FastVit has no attention between patches (it mixes them with RepMixer "
     "convolutions), so there are no attention weights to show."),
])
def test_refusals_name_what_the_model_has(module, name, kwargs, sentence):
    result = walk_one(module, name, kwargs, 224)
    assert result.status == "refused"
    assert result.detail == sentence
    check(result)


# ---- slow: the smallest two members of every family ----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("module", list(FAMILIES))
def test_zoo_walk(module):
    for name in members(module):
        check(walk_one(module, name))
