"""ConViT (issue #22): gated positional self-attention. A GPSA layer's weights are a per-head gated blend of
a content softmax (of q · kᵀ · scale) and a positional softmax (of pos_proj(rel_indices)), renormalised,
over the patches alone; the later MHSA layers attend over the class token and the patches."""
from __future__ import annotations

import pytest

SMALL_CONVIT = {"depth": 3, "local_up_to_layer": 2, "img_size": 64}  # 4 × 4 patches: 2 GPSA, 1 MHSA


def small_capture(name: str = "convit_tiny", seed: int = 1):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor
    from tests.zoo import peak, untrained_init

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **SMALL_CONVIT).eval()
    peak(network)
    untrained_init("convit", network, 64)
    model = attnviz.wrap(network, name, "random init", 64)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    return network, model, x, capture_tensor(model, x)


def attention_inputs(network, x):
    """The (B, N, D) tokens each block's attention is called with, in order."""
    import torch

    seen = []
    handles = [b.attn.register_forward_pre_hook(lambda _m, args: seen.append(args[0])) for b in network.blocks]
    try:
        with torch.no_grad():
            network(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_gpsa_layers_are_the_patches_alone_then_mhsa_layers_have_the_class_token_first():
    import torch

    network, _, x, cap = small_capture()
    assert cap.stages == ((0, 1), (2,))
    assert all(cap.layout(i).grid == (4, 4) for i in range(3))
    # the model's own token layout: the GPSA blocks see PatchEmbed's 16 patches (raster order, flatten);
    # before block local_up_to_layer timm puts cat(cls_token, x): the class token first, then the patches
    seen = attention_inputs(network, x)
    patches = network.pos_drop(network.patch_embed(x) + network.pos_embed)
    assert torch.equal(seen[0], network.blocks[0].norm1(patches))
    for layer in (0, 1):
        lay = cap.layout(layer)
        assert seen[layer].shape[1] == 16 == lay.num_tokens and lay.prefix == 0 and not lay.class_token
        assert lay.windows.tolist() == [list(range(16))] and lay.key_windows is None
        assert cap.summary_kind(layer) == "mean_received"
    lay = cap.layout(2)
    assert seen[2].shape[1] == 17 == lay.num_tokens == lay.num_keys
    assert lay.windows.tolist() == [list(range(17))] and lay.prefix == 1 and lay.class_token
    assert cap.summary_kind(2) == "cls"
    # the class token is token 0 of the MHSA block's input (a pre-hook on the block sees the cat)
    block_in = []
    handle = network.blocks[2].register_forward_pre_hook(lambda _m, args: block_in.append(args[0]))
    with torch.no_grad():
        network(x)
    handle.remove()
    assert torch.equal(block_in[0][0, 0], network.cls_token[0, 0])


def test_the_parts_are_timms_two_softmaxes_and_the_gate_is_sigmoid_of_gating_param():
    import torch

    from tests.zoo import eager_softmaxes

    network, _, x, cap = small_capture()
    # timm's own softmaxes, unchanged rules: GPSA.get_attention takes softmax(patch_score) then
    # softmax(pos_score) (in that order in its source); MHSA takes one
    reference = eager_softmaxes(network, x)
    assert [tuple(r.shape) for r in reference] == [(1, 4, 16, 16)] * 4 + [(1, 4, 17, 17)]
    for layer in (0, 1):
        content, positional = reference[2 * layer][0], reference[2 * layer + 1][0]
        assert (cap.part_weights(layer, "content") - content).abs().max() < 1e-5
        assert torch.equal(cap.part_weights(layer, "positional"), positional)  # computed once, timm's own ops
        gate = torch.sigmoid(network.blocks[layer].attn.gating_param)
        assert torch.equal(cap.gate(layer), gate)
        assert gate.std() > 0.05  # untrained_init drew the gates: each head blends differently
        assert content.max() > 0.5  # peaked
        # the mix, per head, by ConViT's formula: the parts blended by the gate, rows renormalised
        mix = (1 - gate[:, None, None]) * content + gate[:, None, None] * positional
        mix = mix / mix.sum(-1, keepdim=True)
        assert (cap.layer_weights(layer) - mix).abs().max() < 1e-5
        assert (cap.layer_weights(layer) - cap.part_weights(layer, "content")).abs().max() > 1e-3  # not the same
        assert torch.allclose(cap.layer_weights(layer).sum(-1), torch.ones(4, 16))
    assert cap.gate(2) is None
    assert (cap.part_weights(2, "content") - reference[4][0]).abs().max() < 1e-5  # MHSA: its one softmax
    assert torch.equal(cap.part_weights(2, "content"), cap.layer_weights(2))


def test_each_part_answers_rows_maps_and_weights_as_the_whole_matrix_does():
    import numpy as np

    _, _, _, cap = small_capture()
    for layer in (0, 1):
        for part in (None, "content", "positional"):
            full = cap.layer_weights(layer, part)
            for query in (0, 5, 15):
                assert (cap.layer_rows(layer, query, part) - full[:, query]).abs().max() < 1e-6
                assert np.abs(cap.row(layer, 1, query, part) - full[1, query].numpy()).max() < 1e-6
            assert np.abs(cap.weights(layer, "mean", part) - full.mean(0).numpy()).max() < 1e-6
            assert np.abs(cap.query_map(layer, 2, 5, part) - full[2, 5].reshape(4, 4).numpy()).max() < 1e-6
            received = full.mean(0).mean(0).reshape(4, 4).numpy()  # the 16 queries of the one window, heads' mean
            assert np.abs(cap.summary_map(layer, "mean", part) - received).max() < 1e-6
        assert cap.mean_received_map(layer, 0).shape == (4, 4)
    assert cap.cls_map(2, 0).shape == (4, 4)
    with pytest.raises(ValueError, match="no positional part"):
        cap.part_weights(2, "positional")
    with pytest.raises(ValueError, match="part must be one of"):
        cap.layer_weights(0, "gate")


def test_the_positional_part_is_fixed_at_wrap_time_and_the_content_follows_the_image():
    import torch

    from attnviz.capture import capture_tensor

    network, model, _, cap = small_capture()
    other = capture_tensor(model, torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(7)))
    for layer in (0, 1):
        assert torch.equal(cap.part_weights(layer, "positional"), other.part_weights(layer, "positional"))
        assert (cap.part_weights(layer, "content") - other.part_weights(layer, "content")).abs().max() > 1e-2
    assert cap.blend[0][1].shape == (1, 4, 16, 16)  # one window, per head: 4 · 16 · 16 floats per GPSA layer


def test_convit_refuses_a_size_it_was_not_built_for_in_one_sentence():
    import timm

    import attnviz
    from attnviz import ModelError
    from tests.zoo import one_sentence

    network = timm.create_model("convit_tiny", pretrained=False, **SMALL_CONVIT).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "convit_tiny", "random init", 96)
    assert one_sentence(str(error.value))
    assert "built for 64 px" in str(error.value)
