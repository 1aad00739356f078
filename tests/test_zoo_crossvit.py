"""CrossViT (issue #22): one stage per branch at the branch's own grid (the model's PatchEmbed outputs);
each branch's self-attention over its class token and patches, and the cross-attention where that
branch's class token is the one query over itself and the other branch's patches (key_grid)."""
from __future__ import annotations

import pytest

# 120 px: branch 0 cuts 120 px into 12 px patches (10 × 10), branch 1 resizes to 112 px and cuts 16 px (7 × 7)
SMALL_CROSSVIT = {"depth": ((1, 2, 0), (1, 1, 0)), "img_size": 120}


def small_capture(peaked: bool = False):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor
    from tests.zoo import peak

    torch.manual_seed(0)
    network = timm.create_model("crossvit_tiny_240", pretrained=False, **SMALL_CROSSVIT).eval()
    if peaked:
        peak(network)
    model = attnviz.wrap(network, "crossvit_tiny_240", "random init", 120)
    x = torch.randn(1, 3, 120, 120, generator=torch.Generator().manual_seed(1))
    return network, x, capture_tensor(model, x)


def test_crossvit_branch_grids_are_the_models_patch_embeddings():
    import torch

    network, x, cap = small_capture()
    # the model's own token counts: each PatchEmbed's (1, N_i, D_i) output, and the multi-scale blocks'
    # fusion inputs cat(class token of branch i, patches of branch j)
    embedded, fused = [], []
    hooks = [p.register_forward_hook(lambda _m, _i, out: embedded.append(out.shape[1])) for p in network.patch_embed]
    hooks += [f.register_forward_pre_hook(lambda _m, args: fused.append(args[0].shape[1]))
              for m in network.blocks for f in m.fusion]
    with torch.no_grad():
        network(x)
    for h in hooks:
        h.remove()
    assert embedded == [100, 49]
    grids = [(10, 10), (7, 7)]
    # layers in the model's order: per multi-scale block branch 0's blocks, branch 1's, cross 0, cross 1
    kinds = [(0, "self"), (1, "self"), (1, "self"), (0, "cross"), (1, "cross"),
             (0, "self"), (1, "self"), (0, "cross"), (1, "cross")]
    assert cap.num_layers == len(kinds)
    assert cap.stages == ((0, 3, 5, 7), (1, 2, 4, 6, 8))
    crosses = 0
    for layer, (stage, kind) in enumerate(kinds):
        lay = cap.layout(layer)
        assert lay.stage == stage and lay.grid == grids[stage] and lay.prefix == 1 and lay.class_token
        assert lay.block == cap.stages[stage].index(layer)
        assert cap.summary_kind(layer) == "cls"
        if kind == "self":
            assert lay.windows.tolist() == [list(range(1 + grids[stage][0] * grids[stage][1]))]
            assert lay.key_windows is None and lay.keys_grid == grids[stage]
        else:
            other = grids[1 - stage]
            assert lay.windows.tolist() == [[0]] and lay.keys_grid == other and lay.num_key_prefix == 1
            assert lay.keys.tolist() == [list(range(1 + other[0] * other[1]))]
            assert lay.num_keys == fused[crosses]
            crosses += 1
    assert crosses == len(fused) == 4
    assert [cap.layout(i).patch for i in (0, 1)] == [12, 16]


def test_crossvit_cross_attention_map_is_the_class_tokens_row_over_the_other_branch():
    import torch

    from tests.zoo import eager_softmaxes

    network, x, cap = small_capture(peaked=True)
    reference = eager_softmaxes(network, x)
    assert [tuple(r.shape) for r in reference][:5] == [(1, 3, 101, 101), (1, 3, 50, 50), (1, 3, 50, 50),
                                                        (1, 3, 1, 50), (1, 3, 1, 101)]
    for layer in (3, 4, 7, 8):
        lay = cap.layout(layer)
        for head in range(3):
            expected = reference[layer][0, head, 0, 1:].reshape(lay.keys_grid).numpy()
            assert abs(cap.cls_map(layer, head) - expected).max() < 1e-5
        assert abs(cap.row(layer, 0, 0)[0] - float(reference[layer][0, 0, 0, 0])) < 1e-5  # its own key
    for layer in (0, 1, 2, 5, 6):
        assert (cap.layer_weights(layer) - reference[layer][0]).abs().max() < 1e-5
    assert max(float(r.max()) for r in reference) > 0.5
    # token norms: a self-attention layer's block output; a cross-attention layer's branch after the fusion
    outs = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: outs.append([o[0].norm(dim=-1) for o in out]))
             for m in network.blocks]
    with torch.no_grad():
        network(x)
    for h in hooks:
        h.remove()
    for m, (c0, c1) in enumerate(((3, 4), (7, 8))):
        torch.testing.assert_close(cap.token_norms[c0], outs[m][0])
        torch.testing.assert_close(cap.token_norms[c1], outs[m][1])


def test_crossvit_refuses_a_size_it_was_not_built_for():
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model("crossvit_tiny_240", pretrained=False, **SMALL_CROSSVIT).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "crossvit_tiny_240", "random init", 240)
    assert str(error.value) == ("CrossVit was built for 120 px inputs (it resizes any other photo to that), not "
                                "240 px; build it with img_size=240.")
