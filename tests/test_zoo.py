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


# ---- fast: small builds of a few families --------------------------------------------------------

@pytest.mark.parametrize("module, name, kwargs, size", [
    ("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224", {"depth": 2}, 224),
    ("vitamin", "vitamin_small_224", {"depth": 2}, 224),
    ("beit", "beit_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("beit", "beitv2_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("swin_transformer", "swin_tiny_patch4_window7_224", SMALL_SWIN | {"img_size": 112}, 112),
    ("swin_transformer_v2", "swinv2_tiny_window8_256", SMALL_SWIN | {"img_size": 128}, 128),
    ("swin_transformer_v2_cr", "swinv2_cr_tiny_224", SMALL_SWIN | {"img_size": 128}, 128),
    ("nest", "nest_tiny", {"img_size": 64}, 64),  # nest_tiny fixes its widths and depths: only the size is small
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


def wrapped_capture(name: str, size: int, **kwargs):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, img_size=size, **kwargs).eval()
    model = attnviz.wrap(network, name, "random init", size)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    return network, x, capture_tensor(model, x)


def stage_outputs(network, stages, x):
    """Each stage's (C, h, w) output, from a plain forward pass with hooks of the test's own."""
    import torch

    out = []
    handles = [s.register_forward_hook(lambda _m, _i, o: out.append(o[0])) for s in stages]
    with torch.no_grad():
        network(x)
    for h in handles:
        h.remove()
    return out


def test_swin_cr_windows_are_the_models_own_partition_after_its_shift():
    import torch
    from timm.models.swin_transformer_v2_cr import window_partition

    network, x, cap = wrapped_capture("swinv2_cr_tiny_224", 128, **SMALL_SWIN)
    blocks = [b for stage in network.stages for b in stage.blocks]
    assert cap.stages == ((0, 1), (2, 3)) and len(blocks) == 4
    assert [cap.grid(i) for i in range(4)] == [(32, 32), (32, 32), (16, 16), (16, 16)]
    assert [cap.layout(i).patch for i in range(4)] == [4, 4, 8, 8]
    for layer, block in enumerate(blocks):
        lay = cap.layout(layer)
        h, w = lay.grid
        grid = torch.arange(h * w).reshape(1, h, w, 1)
        sh, sw = block.shift_size  # what _shifted_window_attn rolls by, then window_partition
        expected = window_partition(torch.roll(grid, shifts=(-sh, -sw), dims=(1, 2)), block.window_size)
        assert lay.windows.tolist() == expected.reshape(-1, lay.windows.shape[1]).tolist()
    assert cap.layout(0).shift == (0, 0) and cap.layout(1).shift == (2, 2)  # window 4 (1/8 of the 32 grid)
    # each stage's last block's tokens are its output map's cells in raster order
    for layer, out in zip((1, 3), stage_outputs(network, network.stages, x)):
        torch.testing.assert_close(cap.token_norms[layer], out.norm(dim=0).reshape(-1))


def test_nest_windows_are_the_models_own_blocks_at_every_level():
    import torch
    from timm.models.nest import blockify

    network, x, cap = wrapped_capture("nest_tiny", 64)
    assert cap.stages == ((0, 1), (2, 3), tuple(range(4, 12)))
    assert [cap.grid(i) for i in (0, 2, 4)] == [(16, 16), (8, 8), (4, 4)]
    assert [cap.layout(i).patch for i in (0, 2, 4)] == [4, 8, 16]
    assert [cap.layout(i).num_windows for i in (0, 2, 4)] == [16, 4, 1]  # the last level: one block
    for layer in range(cap.num_layers):
        lay = cap.layout(layer)
        h, w = lay.grid
        expected = blockify(torch.arange(h * w).reshape(1, h, w, 1), network.block_size)  # (1, blocks, N, 1)
        assert lay.windows.tolist() == expected[0, :, :, 0].tolist()
    # each level's last layer's tokens are the level's output map's cells in raster order
    last = [i for i, lay in enumerate(cap.layouts) if i + 1 == cap.num_layers or cap.layouts[i + 1].stage != lay.stage]
    for layer, out in zip(last, stage_outputs(network, network.levels, x)):
        torch.testing.assert_close(cap.token_norms[layer], out.norm(dim=0).reshape(-1))


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
    ("swin_transformer_v2_cr", "swinv2_cr_tiny_224", SMALL_SWIN | {"window_size": 8}, "At 224 px, stage 2 of "
     "SwinTransformerV2Cr has a 28 × 28 token grid that does not divide into 8 × 8 windows, so the model pads it "
     "with tokens that are not in the photo; attnviz refuses that size rather than show them (use a size where "
     "every stage divides)."),
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
