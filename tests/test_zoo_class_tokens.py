"""PiT and CaiT (issue #22): class tokens in staged captures. PiT's layers are one window of every token
with its class token(s) first; CaiT's talking-heads layers mix the heads' logits with proj_l, and its
class-attention layers have the class token as their one query."""
from __future__ import annotations

import pytest

from tests.test_zoo import SMALL_CAIT, SMALL_PIT


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
    assert [cap.layout(i).grid for i in range(3)] == [(7, 7), (4, 4), (2, 2)]  # (64 − 16) / 8 + 1, then stride-2 pooling
    assert [cap.layout(i).patch for i in range(3)] == [8, 16, 32]
    assert [cap.heads(i) for i in range(3)] == [2, 4, 8]
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
    assert all(cap.layout(i).grid == (4, 4) for i in range(4))
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
