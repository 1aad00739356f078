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
SMALL_PIT = {"depth": (1, 1, 1), "img_size": 64}  # 7 × 7, 4 × 4, 2 × 2 tokens after the class token(s)
SMALL_CAIT = {"depth": 2, "depth_token_only": 2, "img_size": 64}  # cait_xxs24's width (192, 4 heads): peaked


# ---- fast: small builds of a few families --------------------------------------------------------

@pytest.mark.parametrize("module, name, kwargs, size", [
    ("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224", {"depth": 2}, 224),
    ("vitamin", "vitamin_small_224", {"depth": 2}, 224),
    ("beit", "beit_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("beit", "beitv2_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("swin_transformer", "swin_tiny_patch4_window7_224", SMALL_SWIN | {"img_size": 112}, 112),
    ("swin_transformer_v2", "swinv2_tiny_window8_256", SMALL_SWIN | {"img_size": 128}, 128),
    ("pit", "pit_ti_224", SMALL_PIT, 64),
    ("pit", "pit_ti_distilled_224", SMALL_PIT, 64),
    ("cait", "cait_xxs24_224", SMALL_CAIT, 64),
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


def small_capture(name: str, kwargs: dict, size: int, peaked: bool = False):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor
    from tests.zoo import peak

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    if peaked:
        peak(network)
    model = attnviz.wrap(network, name, "random init", size)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    return network, x, capture_tensor(model, x)


def block_inputs(network, blocks, x):
    """The (B, N, D) tokens each of ``blocks`` is called with (the first argument), in order."""
    import torch

    seen = []
    handles = [b.register_forward_pre_hook(lambda _m, args: seen.append(args[0])) for b in blocks]
    try:
        with torch.no_grad():
            network(x)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize("name, prefix", [("pit_ti_224", 1), ("pit_ti_distilled_224", 2)])
def test_pit_layers_are_one_window_of_every_token_with_the_class_tokens_first(name, prefix):
    import torch

    network, x, cap = small_capture(name, SMALL_PIT, 64)
    assert cap.stages == ((0,), (1,), (2,))
    assert [cap.grid(i) for i in range(3)] == [(7, 7), (4, 4), (2, 2)]  # (64 − 16) / 8 + 1, then stride-2 pooling
    assert [cap.layout(i).patch for i in range(3)] == [8, 16, 32]
    assert [cap.num_heads(i) for i in range(3)] == [2, 4, 8]
    # the model's own token layout: each stage's tokens are cat(class tokens, x.flatten(2).transpose(1, 2)),
    # i.e. the prefix, then the stage's (h, w) feature map in raster order; every token attends to every token
    maps = []
    hooks = [t.register_forward_hook(lambda _m, _i, out: maps.append(out[0].shape[-2:])) for t in network.transformers]
    seen = block_inputs(network, [b for t in network.transformers for b in t.blocks], x)
    for h in hooks:
        h.remove()
    for layer, (tokens, grid) in enumerate(zip(seen, maps)):
        lay = cap.layout(layer)
        assert tuple(grid) == lay.grid and tokens.shape[1] == prefix + grid[0] * grid[1] == lay.num_tokens
        assert lay.prefix == prefix and lay.class_token and lay.key_windows is None
        assert lay.windows.tolist() == [list(range(lay.num_tokens))]
        assert cap.summary_kind(layer) == "cls"
        # the class token's map is its row over the grid cells (the distillation token is not a cell)
        full = cap.layer_weights(layer)  # (H, N, N)
        assert torch.allclose(full.sum(-1), torch.ones(()), atol=1e-5)
        assert abs(cap.cls_map(layer, 0) - full[0, 0, prefix:].reshape(lay.grid).numpy()).max() < 1e-7
    assert cap.has_class_token and cap.num_prefix_tokens == prefix


def test_pit_refuses_sizes_its_position_embedding_does_not_take():
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model("pit_ti_224", pretrained=False, **SMALL_PIT).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "pit_ti_224", "random init", 96)
    assert str(error.value) == ("PoolingVisionTransformer was built for 64 px inputs (its position embedding is a "
                                "fixed 7 × 7 grid), not 96 px; build it with img_size=96.")


def test_cait_talking_heads_then_class_attention_with_the_class_token_the_one_query():
    import torch

    from tests.zoo import eager_softmaxes

    network, x, cap = small_capture("cait_xxs24_224", SMALL_CAIT, 64, peaked=True)
    assert cap.stages == ((0, 1), (2, 3))
    assert all(cap.grid(i) == (4, 4) for i in range(4))
    # the model's own token layout: the talking-heads blocks see the 16 patches alone, raster order
    # (PatchEmbed's flatten); the class-attention blocks attend from cat(x_cls, x): the class token first
    seen = block_inputs(network, list(network.blocks), x)
    for layer in (0, 1):
        lay = cap.layout(layer)
        assert seen[layer].shape[1] == 16 == lay.num_tokens and lay.prefix == 0 and not lay.class_token
        assert lay.windows.tolist() == [list(range(16))] and lay.key_windows is None
        assert cap.summary_kind(layer) == "mean_received"
        assert torch.equal(cap.mix[layer], network.blocks[layer].attn.proj_l.weight)
        assert cap.bias[layer].reshape(-1).tolist() == network.blocks[layer].attn.proj_l.bias.tolist()
    for layer in (2, 3):
        lay = cap.layout(layer)
        assert lay.windows.tolist() == [[0]] and lay.keys.tolist() == [list(range(17))]
        assert lay.prefix == 1 and lay.class_token and lay.num_tokens == lay.num_keys == 17
        assert cap.summary_kind(layer) == "cls" and cap.mix[layer] is None
    # cls_map of a class-attention layer is the class token's softmax row timm's eager ClassAttn computes
    reference = eager_softmaxes(network, x)  # 2 talking-heads (1, H, 16, 16), then 2 class attention (1, H, 1, 17)
    assert [tuple(r.shape) for r in reference] == [(1, 4, 16, 16)] * 2 + [(1, 4, 1, 17)] * 2
    for layer in (2, 3):
        for head in range(4):
            expected = reference[layer][0, head, 0, 1:].reshape(4, 4).numpy()
            assert abs(cap.cls_map(layer, head) - expected).max() < 1e-5
            assert abs(cap.summary_map(layer, head) - expected).max() < 1e-5
        assert abs(cap.row(layer, 0, 0)[0] - float(reference[layer][0, 0, 0, 0])) < 1e-5  # the class token's own key
    # the talking-heads weights: softmax of the heads' logits mixed by proj_l (with its bias), per head
    for layer in (0, 1):
        assert (cap.layer_weights(layer) - reference[layer][0]).abs().max() < 1e-5
        assert reference[layer].max() > 0.5  # peaked: proj_l's mix (with tests.zoo.peak's identity) keeps the logits
    with pytest.raises(Exception, match="no class-token row"):
        cap.cls_map(0, 0)


@pytest.mark.parametrize("module, name, kwargs, sentence", [
    ("convnext", "convnext_zepto_rms", {}, "ConvNeXt has no attention between patches (it mixes them with "
     "convolutions), so there are no attention weights to show."),
    ("swiftformer", "swiftformer_xs", {}, "SwiftFormer has no attention between patches (it mixes them with "
     "additive attention, which has no softmax between tokens), so there are no attention weights to show."),
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
