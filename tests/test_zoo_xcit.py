"""XCiT (issue #22): only its class-attention layers have a token map. Its cross-covariance attention
(XCA) is a channels × channels softmax per head: the zoo reference drops it by module, attnviz does not
read it, and the page says why in one sentence."""
from __future__ import annotations

import pytest

from tests.test_zoo_class_tokens import block_inputs, small_capture

SMALL_XCIT = {"depth": 2, "embed_dim": 384, "num_heads": 8}  # xcit_small's width: peaked class attention


def test_xcit_reads_its_class_attention_layers_with_the_class_token_the_one_query():
    import torch

    from tests.zoo import eager_softmaxes

    network, x, cap = small_capture("xcit_nano_12_p8_224", SMALL_XCIT, 64, peaked=True)
    assert cap.stages == ((0, 1),) and cap.num_layers == len(network.cls_attn_blocks) == 2
    assert cap.note == "stages.unread_xcit"
    # the model's own token layout: forward_cls attends from cat(cls_token, x), x the patch embedding's
    # (B, Hp · Wp, C) tokens in raster order: the class token, then the 8 × 8 patches
    seen = block_inputs(network, list(network.cls_attn_blocks), x)
    for layer, tokens in enumerate(seen):
        lay = cap.layout(layer)
        assert tokens.shape[1] == 1 + 64 == lay.num_tokens == lay.num_keys and lay.grid == (8, 8)
        assert lay.windows.tolist() == [[0]] and lay.keys.tolist() == [list(range(65))]
        assert lay.prefix == 1 and lay.class_token and cap.summary_kind(layer) == "cls"
    dropped = []
    reference = eager_softmaxes(network, x, "xcit", dropped)
    # one XCA softmax per main block, (1, H, d_k, d_k) over channels; the two class attentions (1, H, 1, 65) kept
    assert len(dropped) == len(network.blocks) == 2
    assert all(tuple(d.shape) == (1, 8, 48, 48) for d in dropped)
    assert [tuple(r.shape) for r in reference] == [(1, 8, 1, 65)] * 2
    for layer in (0, 1):
        assert torch.allclose(cap.layer_weights(layer)[:, 0], reference[layer][0, :, 0], atol=1e-5)


def test_xcit_takes_any_multiple_of_its_patch_and_refuses_others():
    import timm

    import attnviz
    from attnviz import ModelError
    from tests.zoo import one_sentence

    network = timm.create_model("xcit_nano_12_p8_224", pretrained=False, depth=1).eval()
    assert attnviz.wrap(network, "xcit", "random init", 96).adapter.layouts[0].grid == (12, 12)
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "xcit", "random init", 100)
    assert one_sentence(str(error.value)) and "8 px patches" in str(error.value)
