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
SMALL_MAXVIT = {"depths": (1, 1, 1, 1), "img_size": 64}  # 2 × 2 block and grid partitions at 64 px
SMALL_GCVIT = {"embed_dim": 32, "img_size": 64}  # 2 × 2 windows (4 × 4 in stage 3), global queries 2 × 2


# ---- fast: small builds of a few families --------------------------------------------------------

@pytest.mark.parametrize("module, name, kwargs, size", [
    ("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224", {"depth": 2}, 224),
    ("vitamin", "vitamin_small_224", {"depth": 2}, 224),
    ("beit", "beit_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("beit", "beitv2_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("swin_transformer", "swin_tiny_patch4_window7_224", SMALL_SWIN | {"img_size": 112}, 112),
    ("swin_transformer_v2", "swinv2_tiny_window8_256", SMALL_SWIN | {"img_size": 128}, 128),
    ("maxxvit", "maxvit_pico_rw_256", SMALL_MAXVIT, 64),
    ("maxxvit", "maxvit_rmlp_pico_rw_256", SMALL_MAXVIT, 64),
    ("maxxvit", "coatnet_pico_rw_224", {"depths": (1, 1, 2, 1), "img_size": 64}, 64),
    ("gcvit", "gcvit_xxtiny", SMALL_GCVIT, 64),
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


def staged_layouts(name: str, kwargs: dict, size: int):
    import timm
    import torch

    import attnviz

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    return network, attnviz.wrap(network, name, "random init", size).adapter.layouts


def partitioned(partition, grid: tuple[int, int], size) -> list[list[int]]:
    """A timm partition function applied to the (1, h, w, 1) grid of token indices: (W, T) as lists."""
    import torch

    tokens = torch.arange(grid[0] * grid[1]).reshape(1, *grid, 1)
    return partition(tokens, list(size)).reshape(-1, size[0] * size[1]).tolist()


def test_maxvit_block_and_grid_layers_are_timms_own_partitions():
    from timm.models.maxxvit import grid_partition, window_partition

    network, layouts = staged_layouts("maxvit_pico_rw_256", {"depths": (1, 2, 1, 1), "img_size": 128}, 128)
    blocks = [p for s in network.stages for b in s.blocks for p in (b.attn_block, b.attn_grid)]
    assert len(layouts) == len(blocks) == 10
    assert [(lay.stage, lay.block) for lay in layouts[:6]] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert [lay.grid for lay in layouts[::2]] == [(32, 32), (16, 16), (16, 16), (8, 8), (4, 4)]
    for lay, part in zip(layouts, blocks):
        assert lay.window == (4, 4) and lay.patch == 128 // lay.grid[0]
        partition = window_partition if part.partition_block else grid_partition
        assert lay.windows.tolist() == partitioned(partition, lay.grid, lay.window)
        assert lay.key_windows is None
    # a grid window's tokens are h/G rows and w/G columns apart: window 0 of stage 1 is rows and columns 0, 4, 8, 12
    assert layouts[1].windows[0].tolist()[:4] == [0, 8, 16, 24] and layouts[3].windows[0][:4].tolist() == [0, 4, 8, 12]


def test_coatnet_transformer_layers_are_one_window_of_their_stages_whole_grid():
    network, layouts = staged_layouts("coatnet_pico_rw_224", {"depths": (1, 1, 2, 1), "img_size": 64}, 64)
    assert [(lay.stage, lay.block, lay.grid) for lay in layouts] == [(2, 0, (4, 4)), (2, 1, (4, 4)), (3, 0, (2, 2))]
    for lay in layouts:
        assert lay.windows.tolist() == [list(range(lay.grid[0] * lay.grid[1]))] and lay.patch == 64 // lay.grid[0]
    result = walk_one("maxxvit", "coatnet_pico_rw_224", {"depths": (1, 1, 2, 1), "img_size": 64}, 128)
    assert result.status == "refused" and one_sentence(result.detail)
    assert result.detail == ("MaxxVit's transformer blocks in stage 3 have a position bias for a 4 × 4 token grid, "
                             "not the 8 × 8 grid of 128 px inputs; build it with img_size=128.")


def test_gcvit_layers_are_timms_own_windows_with_global_queries_in_odd_blocks():
    from timm.models.gcvit import window_partition

    network, layouts = staged_layouts("gcvit_xxtiny", SMALL_GCVIT | {"img_size": 128}, 128)
    assert [(lay.stage, lay.block) for lay in layouts] == [(s, b) for s, d in enumerate((2, 2, 6, 2)) for b in range(d)]
    blocks = [b for s in network.stages for b in s.blocks]
    for lay, block in zip(layouts, blocks):
        assert lay.windows.tolist() == partitioned(lambda x, w: window_partition(x, tuple(w)), lay.grid, lay.window)
        assert block.attn.use_global == (lay.block % 2 == 1)
    assert [lay.grid for lay in layouts[::2]] == [(32, 32), (16, 16), (8, 8), (8, 8), (8, 8), (4, 4)]


def test_gcvit_refuses_a_size_it_was_not_built_for():
    result = walk_one("gcvit", "gcvit_xxtiny", SMALL_GCVIT, 128)
    assert result.status == "refused"
    assert result.detail == ("GlobalContextVit was built for 64 px inputs, not 128 px, and the grid of its global queries "
                             "is fixed when it is built; build it with img_size=128.")


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
