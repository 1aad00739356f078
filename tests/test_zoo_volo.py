"""VOLO (issue #22): its self-attention and class-attention layers are read; its first stage's outlook
attention (local weights made from each token alone, no query-key product) is dropped from the zoo
reference by module, not read, and the page says why in one sentence."""
from __future__ import annotations

import pytest

from tests.test_zoo_class_tokens import block_inputs, small_capture

SMALL_VOLO = {"img_size": 64}  # volo_d1's blocks on an 8 × 8 outlook grid, then 4 × 4


def test_volo_layers_are_one_window_of_the_downsampled_grid_then_class_attention():
    import torch

    from timm.models.volo import Outlooker, Transformer

    from tests.zoo import eager_softmaxes

    network, x, cap = small_capture("volo_d1_224", SMALL_VOLO, 64, peaked=True)
    transformers = [b for s in network.network if isinstance(s, torch.nn.Sequential) for b in s
                    if type(b) is Transformer]
    assert cap.stages == ((0, 1, 2, 3), tuple(range(4, 12)), (12, 13), (14, 15))
    assert cap.note == "stages.unread_volo"
    # the model's own token layout: a Transformer block attends over its (B, h, w, C) input reshaped to
    # (B, h · w, C), raster order; q, k = qkv(x).reshape(B, h · w, 3, H, d_k).permute(2, 0, 3, 1, 4)
    qkvs = []
    hooks = [b.attn.qkv.register_forward_hook(lambda _m, _i, out: qkvs.append(out)) for b in transformers]
    seen = block_inputs(network, transformers, x)
    for h in hooks:
        h.remove()
    for layer, (tokens, qkv) in enumerate(zip(seen, qkvs)):
        lay = cap.layout(layer)
        assert tuple(tokens.shape[1:3]) == lay.grid == (4, 4) and lay.patch == 16
        assert lay.windows.tolist() == [list(range(16))] and lay.key_windows is None and lay.prefix == 0
        heads = lay.num_heads
        q, k, _ = qkv.reshape(1, 16, 3, heads, -1).permute(2, 0, 3, 1, 4)
        assert torch.equal(cap.query[layer][:, 0], q[0]) and torch.equal(cap.key[layer][:, 0], k[0])
    for layer in (14, 15):  # post_network: forward_cls's cat(cls_token, x), the class token first
        lay = cap.layout(layer)
        assert lay.windows.tolist() == [[0]] and lay.keys.tolist() == [list(range(17))]
        assert lay.prefix == 1 and lay.class_token and cap.summary_kind(layer) == "cls"
    dropped = []
    reference = eager_softmaxes(network, x, "volo", dropped)
    outlookers = [b for s in network.network if isinstance(s, torch.nn.Sequential) for b in s if type(b) is Outlooker]
    # one outlook softmax per Outlooker block: (B, H, locations, k², k²) over a 3 × 3 neighbourhood
    assert len(dropped) == len(outlookers) == 4
    assert all(tuple(d.shape) == (1, 6, 16, 9, 9) for d in dropped)  # stride 2: 4 × 4 locations of the 8 × 8 grid
    assert [tuple(r.shape) for r in reference] == [(1, 12, 16, 16)] * 14 + [(1, 12, 1, 17)] * 2


def test_volo_takes_only_the_size_it_was_built_for():
    import timm

    import attnviz
    from attnviz import ModelError
    from tests.zoo import one_sentence

    network = timm.create_model("volo_d1_224", pretrained=False, **SMALL_VOLO).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "volo", "random init", 96)
    assert one_sentence(str(error.value)) and "built for 64 px inputs" in str(error.value)
