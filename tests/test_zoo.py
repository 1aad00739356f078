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
# 112 px: a 7 × 7 stage, then 4 × 4 queries (cells 0, 2, 4, 6) over its 7 × 7 keys
SMALL_LEVIT = {"embed_dim": (32, 48), "key_dim": 8, "num_heads": (2, 3), "depth": (1, 1), "img_size": 112}
# 128 px: stage 3's attention on its 8 × 8 grid strided to 4 × 4, stage 4's queries 4 × 4 over 8 × 8 keys
SMALL_EFV2 = {"depths": (1, 1, 2, 2), "embed_dims": (16, 24, 32, 48), "mlp_ratios": 2, "num_vit": 1, "img_size": 128}
# Hiera / HieraDet at 224 px: stages (1, 2, 2, 1), pooled queries at blocks 1, 3, 5; mask units (windows)
# of 8, 4 (pooled), then global (Hiera) or 14 × 14 windows with block 4 global (HieraDet)
SMALL_HIERA = {"stages": (1, 2, 2, 1), "embed_dim": 32}
SMALL_HIERADET = {"stages": (1, 2, 2, 1), "embed_dim": 32, "global_att_blocks": (4,)}
SMALL_PVT_LINEAR = {"depths": (1, 1, 1, 1), "embed_dims": (32, 64, 160, 256)}  # pvt_v2_b2_li: 7 × 7 pooled keys
SMALL_TWINS = {"embed_dims": (32, 64, 128, 256), "num_heads": (1, 2, 4, 8)}
SMALL_MAXVIT = {"depths": (1, 1, 1, 1), "img_size": 64}  # 2 × 2 block and grid partitions at 64 px
SMALL_GCVIT = {"embed_dim": 32, "img_size": 64}  # 2 × 2 windows (4 × 4 in stage 3), global queries 2 × 2
SMALL_SAM = {"depth": 3, "embed_dim": 64, "num_heads": 4, "global_attn_indexes": (1,)}  # windowed, global, windowed
SMALL_CAIT = {"depth": 2, "depth_token_only": 2, "img_size": 64}  # cait_xxs24's width (192, 4 heads): peaked
# A conv stage, then windows of 7 on a 28 grid (16 windows), a 14 grid (4) and one 7 × 7 window.
SMALL_TINY_VIT = {"embed_dims": (16, 32, 48, 64), "depths": (1, 2, 1, 1), "num_heads": (1, 2, 3, 2),
                  "window_sizes": (7, 7, 7, 7)}
# Windows of 7 on a 14 grid (4 windows), then one 7 × 7 window, then one 4 × 4.
SMALL_EFFICIENTVIT = {"embed_dim": (16, 32, 48), "key_dim": (4, 8, 8), "depth": (1, 2, 1), "num_heads": (2, 2, 3)}
# thin convolutional stages, then two Meta3D blocks as wide as efficientformer_l7's (so peaked logits are peaked)
SMALL_EFFICIENTFORMER = {"depths": (1, 1, 1, 2), "embed_dims": (16, 16, 32, 768), "num_vit": 2}


# ---- fast: small builds of a few families --------------------------------------------------------

# (timm module, model, build kwargs, input size): small builds of every family, a few seconds each
SMALL_BUILDS = [
    ("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224", {"depth": 2}, 224),
    ("vitamin", "vitamin_small_224", {"depth": 2}, 224),
    ("beit", "beit_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("beit", "beitv2_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("swin_transformer", "swin_tiny_patch4_window7_224", SMALL_SWIN | {"img_size": 112}, 112),
    ("swin_transformer_v2", "swinv2_tiny_window8_256", SMALL_SWIN | {"img_size": 128}, 128),
    ("tiny_vit", "tiny_vit_5m_224", SMALL_TINY_VIT, 224),
    ("tiny_vit", "tiny_vit_5m_224", SMALL_TINY_VIT | {"window_sizes": (7, 7, 14, 7)}, 224),  # one 14 × 14 window
    ("efficientvit_msra", "efficientvit_m0", SMALL_EFFICIENTVIT, 224),
    ("efficientformer", "efficientformer_l1", SMALL_EFFICIENTFORMER, 224),
    ("visformer", "visformer_tiny", {"depth": (1, 2, 1)}, 224),
    ("shvit", "shvit_s1", {"depth": (1, 2, 1)}, 224),
    ("swin_transformer_v2_cr", "swinv2_cr_tiny_224", SMALL_SWIN | {"img_size": 128}, 128),
    ("nest", "nest_tiny", {"img_size": 64}, 64),  # nest_tiny fixes its widths and depths: only the size is small
    ("pit", "pit_ti_224", SMALL_PIT, 64),
    ("pit", "pit_ti_distilled_224", SMALL_PIT, 64),
    ("cait", "cait_xxs24_224", SMALL_CAIT, 64),
    ("levit", "levit_128s", SMALL_LEVIT, 112),
    ("levit", "levit_conv_128s", SMALL_LEVIT, 112),
    ("efficientformer_v2", "efficientformerv2_s0", SMALL_EFV2, 128),
    ("pvt_v2", "pvt_v2_b0", {"depths": (1, 1, 1, 1)}, 64),
    ("pvt_v2", "pvt_v2_b2_li", SMALL_PVT_LINEAR, 64),
    ("twins", "twins_svt_small", SMALL_TWINS | {"depths": (2, 2, 2, 2), "wss": (4, 4, 2, 2)}, 64),
    ("twins", "twins_pcpvt_small", SMALL_TWINS | {"depths": (1, 1, 1, 1)}, 64),
    ("tnt", "tnt_s_patch16_224", {"depth": 2, "img_size": 64}, 64),  # 4 × 4 patches of 4 × 4 pixel tokens
    ("tnt", "tnt_s_legacy_patch16_224", {"depth": 2, "img_size": 64}, 64),
    ("crossvit", "crossvit_tiny_240", {"depth": ((1, 2, 0), (1, 1, 0)), "img_size": 120}, 120),  # 10 × 10, 7 × 7
    ("nextvit", "nextvit_small", {"depths": (1, 1, 5, 1)}, 64),
    ("maxxvit", "maxvit_pico_rw_256", SMALL_MAXVIT, 64),
    ("maxxvit", "maxvit_rmlp_pico_rw_256", SMALL_MAXVIT, 64),
    ("maxxvit", "coatnet_pico_rw_224", {"depths": (1, 1, 2, 1), "img_size": 64}, 64),
    ("gcvit", "gcvit_xxtiny", SMALL_GCVIT, 64),
    ("mvitv2", "mvitv2_tiny", {"img_size": 64}, 64),
    ("vision_transformer_sam", "samvit_base_patch16_224", SMALL_SAM | {"img_size": 448}, 448),
    ("hiera", "hiera_tiny_224", SMALL_HIERA, 224),
    ("hieradet_sam2", "sam2_hiera_tiny", SMALL_HIERADET, 224),
    ("convit", "convit_tiny", {"depth": 3, "local_up_to_layer": 2, "img_size": 64}, 64),
    ("convit", "convit_small", {"depth": 3, "local_up_to_layer": 2, "img_size": 64}, 64),
    ("xcit", "xcit_nano_12_p8_224", {"depth": 1, "embed_dim": 384, "num_heads": 8}, 64),
    ("volo", "volo_d1_224", {"img_size": 64}, 64),
    ("davit", "davit_tiny", {"depths": (1, 1, 1, 1), "embed_dims": (32, 64, 96, 128), "num_heads": (1, 2, 3, 4),
                             "window_size": 4}, 128),
]


@pytest.mark.parametrize("module, name, kwargs, size", SMALL_BUILDS)
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
    assert [cap.layout(i).grid for i in range(4)] == [(28, 28), (28, 28), (14, 14), (14, 14)]
    assert [cap.layout(i).patch for i in range(4)] == [4, 4, 8, 8]
    assert [cap.heads(i) for i in range(4)] == [2, 2, 4, 4]
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


def own_partition(block, attention, grid: tuple[int, int], channels_last: bool):
    """(W, T): the token each window row holds when ``block`` (a TinyViT block or EfficientViT's
    LocalWindowAttention) partitions a grid whose channel 0 is the token index, read at the input of
    its ``attention`` module: the model's own window partition, not attnviz's."""
    import torch

    seen = []
    hook = attention.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    index = torch.arange(grid[0] * grid[1], dtype=torch.float32).reshape(1, *grid)
    x = torch.zeros(1, *grid, block.dim) if channels_last else torch.zeros(1, block.dim, *grid)
    if channels_last:
        x[..., 0] = index
    else:
        x[:, 0] = index
    try:
        with torch.no_grad():
            block(x)
    finally:
        hook.remove()
    windows = seen[0]
    rows = windows[..., 0] if channels_last else windows[:, 0].flatten(1)  # (W, T) either way
    return rows.round().long()


@pytest.mark.parametrize("name, kwargs", [
    ("tiny_vit_5m_224", {}), ("tiny_vit_5m_224", SMALL_TINY_VIT),
    ("efficientvit_m0", {}), ("efficientvit_m0", SMALL_EFFICIENTVIT),
])
def test_learned_bias_windows_are_the_models_own_partition(name, kwargs):
    import timm

    import attnviz

    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    model = attnviz.wrap(network, name, "random init", 224)
    adapter = model.adapter
    for layer, (lay, attention, block) in enumerate(zip(adapter.layouts, adapter.attentions, adapter.blocks)):
        tiny = name.startswith("tiny_vit")
        mixer = block if tiny else block.mixer.m
        windows = own_partition(mixer, attention, lay.grid, channels_last=tiny)
        assert lay.windows.tolist() == windows.tolist(), layer
        assert lay.key_windows is None and lay.prefix == 0 and lay.shift == (0, 0)
        assert lay.num_windows * lay.windows.shape[1] == lay.num_tokens  # every token in exactly one window
        bias = adapter.window_bias[layer]  # (1, H, T, T): the module's table at its offsets
        assert bias.shape == (1, lay.num_heads, *lay.windows.shape[1:], lay.windows.shape[1])
    grids = [lay.grid for lay in adapter.layouts]
    if name.startswith("tiny_vit") and not kwargs:  # the conv stage has no layers; 14 × 14 is one window
        assert grids == [(28, 28)] * 2 + [(14, 14)] * 6 + [(7, 7)] * 2
        assert [lay.num_windows for lay in adapter.layouts] == [16] * 2 + [1] * 6 + [1] * 2
        assert [lay.stage for lay in adapter.layouts] == [0] * 2 + [1] * 6 + [2] * 2
    if name.startswith("efficientvit") and not kwargs:
        assert grids == [(14, 14)] + [(7, 7)] * 2 + [(4, 4)] * 3
        assert [lay.num_windows for lay in adapter.layouts] == [4, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("name, kwargs, size, sentence", [
    ("tiny_vit_5m_224", {}, 256, "At 256 px, stage 2 of TinyVit has a 32 × 32 token grid that does not divide "
     "into 7 × 7 windows, so the model pads it with tokens that are not in the photo; attnviz refuses that size "
     "rather than show them (use a size where every stage divides)."),
    ("tiny_vit_5m_224", {}, 240, "The input size must be a multiple of TinyVit's 32 px token size at its last "
     "stage; 240 px is not."),
    ("efficientvit_m0", {"img_size": 256}, 256, "At 256 px, stage 1 of EfficientVitMsra has a 16 × 16 token grid "
     "that does not divide into 7 × 7 windows, so the model pads it with tokens that are not in the photo; "
     "attnviz refuses that size rather than show them (use a size where every stage divides)."),
    ("efficientvit_m0", {}, 448, "EfficientVitMsra was built for 224 px inputs, not 448 px; build it with "
     "img_size=448 (or dynamic_img_size=True)."),
])
def test_learned_bias_windows_refuse_padding(name, kwargs, size, sentence):
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, name, "random init", size)
    assert str(error.value) == sentence
    assert one_sentence(sentence)


@pytest.mark.parametrize("module, name, kwargs, size", [
    ("tiny_vit", "tiny_vit_5m_224", SMALL_TINY_VIT, 224),
    ("efficientvit_msra", "efficientvit_m0", SMALL_EFFICIENTVIT, 224),
])
def test_learned_bias_is_part_of_the_weights(module, name, kwargs, size, monkeypatch):
    """The walk is not blind to the bias: the capture without it is off by far more than the tolerance."""
    import tests.zoo as zoo

    real = zoo.as_layers
    missed = []

    def without_bias(reference, cap):
        import dataclasses
        bare = dataclasses.replace(cap, bias=(None,) * cap.num_layers)
        layers = real(reference, cap)
        missed.append(zoo.max_difference(bare, layers))
        return layers

    monkeypatch.setattr(zoo, "as_layers", without_bias)
    result = zoo.walk_one(module, name, kwargs, size)
    assert result.exact and missed[0] > 0.05, (result, missed)
def global_capture(name: str, kwargs: dict, size: int = 224):
    """A small random build, captured, with what each attention module saw: its input's token grid (h, w)
    and the output of its ``qkv``."""
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    model = attnviz.wrap(network, name, "random init", size)
    seen = []
    hooks = []
    for attn in model.adapter.attentions:
        record = {}
        seen.append(record)
        hooks.append(attn.register_forward_pre_hook(lambda m, a, r=record: r.update(input=a[0])))
        hooks.append(attn.qkv.register_forward_hook(lambda m, a, out, r=record: r.update(qkv=out)))
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    cap = capture_tensor(model, x)
    for hook in hooks:
        hook.remove()
    return network, model, cap, seen


def test_efficientformer_layers_are_its_meta3d_blocks_over_the_flattened_last_grid():
    import torch
    from timm.models.efficientformer import Flat, MetaBlock1d

    network, model, cap, seen = global_capture("efficientformer_l1", SMALL_EFFICIENTFORMER)
    meta3d = [b.token_mixer for b in network.stages[3].blocks if isinstance(b, MetaBlock1d)]
    assert cap.num_layers == 2 and list(model.adapter.attentions) == meta3d
    assert [cap.layout(layer).block for layer in range(2)] == [0, 1]
    lay = cap.layout(0)
    assert lay.grid == (7, 7) and lay.num_windows == 1 and lay.stage == 3
    # the model's own Flat on a grid that holds each cell's raster index: token t is cell windows[0, t]
    grid = torch.arange(49.0).reshape(1, 1, 7, 7)
    assert Flat()(grid)[0, :, 0].long().tolist() == lay.windows[0].tolist() == list(range(49))
    # q of head h at token t: the first d_k of head h's slice of qkv (per head: q, k, v), as timm splits it
    attn, qkv = model.adapter.attentions[0], seen[0]["qkv"][0]  # (N, H · (2 d_k + d_v))
    per_head = 2 * attn.key_dim + attn.val_dim
    for h in (0, attn.num_heads - 1):
        torch.testing.assert_close(cap.query[0][h, 0], qkv[:, h * per_head:h * per_head + attn.key_dim], rtol=0, atol=0)
        torch.testing.assert_close(cap.key[0][h, 0], qkv[:, h * per_head + attn.key_dim:h * per_head + 2 * attn.key_dim],
                                   rtol=0, atol=0)
    # the bias is the table entry of |Δrow| · 7 + |Δcol| (a plain loop over two cells)
    bias = cap.bias[0][0]  # (H, N, N)
    i, j = 3 * 7 + 5, 6 * 7 + 1  # cells (3, 5) and (6, 1)
    assert bias[2, i, j] == attn.attention_biases[2, 3 * 7 + 4]
    # rows sum to one over all 49 keys (global attention)
    torch.testing.assert_close(cap.layer_weights(1).sum(-1), torch.ones(attn.num_heads, 49))


def test_efficientformer_takes_only_the_size_of_its_bias_table():
    from tests.zoo import walk_one as walk

    result = walk("efficientformer", "efficientformer_l1", SMALL_EFFICIENTFORMER, 256)
    assert result.status == "refused" and one_sentence(result.detail)
    assert result.detail == ("EfficientFormer's attention bias is a learned table for a 7 × 7 token grid, so it "
                             "takes only 224 px inputs, not 256.")


@pytest.mark.parametrize("name, kwargs, grids, heads", [
    ("visformer_tiny", {"depth": (1, 2, 1)}, [(14, 14), (14, 14), (7, 7)], 3),
    ("shvit_s1", {"depth": (1, 2, 1)}, [(7, 7), (7, 7), (4, 4)], 1),
])
def test_conv_stage_layers_read_their_feature_map_in_raster_order(name, kwargs, grids, heads):
    """Visformer and SHViT attend over a (1, C, h, w) feature map: token i · w + j is cell (i, j), in q, k
    (channels of ``qkv``'s output at that cell) and in the block's output norms."""
    import torch

    network, model, cap, seen = global_capture(name, kwargs)
    assert [cap.layout(layer).grid for layer in range(cap.num_layers)] == grids
    assert [cap.heads(layer) for layer in range(cap.num_layers)] == [heads] * len(grids)
    for layer, record in enumerate(seen):
        lay = cap.layout(layer)
        h, w = record["input"].shape[-2:]  # the feature map the attention module is called on
        assert lay.grid == (h, w) and lay.num_windows == 1
        assert lay.windows[0].tolist() == [i * w + j for i in range(h) for j in range(w)]
        qkv = record["qkv"][0]  # (channels, h, w)
        d = lay.head_dim
        for i, j in ((0, 0), (0, w - 1), (h - 1, 1)):
            for head in range(heads):
                # Visformer: channels (3, H, d_k); SHViT: q (d_qk), k (d_qk), v along the channels
                q_rows = slice(head * d, (head + 1) * d)
                k_rows = slice((heads + head) * d, (heads + head + 1) * d)
                assert torch.equal(cap.query[layer][head, 0, i * w + j], qkv[q_rows, i, j])
                assert torch.equal(cap.key[layer][head, 0, i * w + j], qkv[k_rows, i, j])
    # the block output's norms, cell (i, j) at token i · w + j
    out = {}
    block = model.adapter.blocks[-1]
    hook = block.register_forward_hook(lambda m, a, o: out.update(x=o))
    from attnviz.capture import capture_tensor
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    cap = capture_tensor(model, x)
    hook.remove()
    h, w = out["x"].shape[-2:]
    torch.testing.assert_close(cap.token_norms[-1][(h - 1) * w + 2], out["x"][0, :, h - 1, 2].norm())


def test_shvit_takes_multiples_of_its_stem():
    from tests.zoo import walk_one as walk

    result = walk("shvit", "shvit_s1", {"depth": (1, 1, 1)}, 200)
    assert result.status == "refused" and one_sentence(result.detail)
    assert result.detail == "The input size must be a multiple of SHViT's 16 px stem; 200 px is not."


@pytest.mark.parametrize("module, name, kwargs, sentence", [
    ("convnext", "convnext_zepto_rms", {}, "ConvNeXt has no attention between patches (it mixes them with "
     "convolutions), so there are no attention weights to show."),
    ("swiftformer", "swiftformer_xs", {}, "SwiftFormer has no attention between patches (it mixes them with "
     "additive attention, which has no softmax between tokens), so there are no attention weights to show."),
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
