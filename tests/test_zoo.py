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
SMALL_PVT_LINEAR = {"depths": (1, 1, 1, 1), "embed_dims": (32, 64, 160, 256)}  # pvt_v2_b2_li: 7 × 7 pooled keys
SMALL_TWINS = {"embed_dims": (32, 64, 128, 256), "num_heads": (1, 2, 4, 8)}


# ---- fast: small builds of a few families --------------------------------------------------------

@pytest.mark.parametrize("module, name, kwargs, size", [
    ("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224", {"depth": 2}, 224),
    ("vitamin", "vitamin_small_224", {"depth": 2}, 224),
    ("beit", "beit_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("beit", "beitv2_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("swin_transformer", "swin_tiny_patch4_window7_224", SMALL_SWIN | {"img_size": 112}, 112),
    ("swin_transformer_v2", "swinv2_tiny_window8_256", SMALL_SWIN | {"img_size": 128}, 128),
    ("pvt_v2", "pvt_v2_b0", {"depths": (1, 1, 1, 1)}, 64),
    ("pvt_v2", "pvt_v2_b2_li", SMALL_PVT_LINEAR, 64),
    ("twins", "twins_svt_small", SMALL_TWINS | {"depths": (2, 2, 2, 2), "wss": (4, 4, 2, 2)}, 64),
    ("twins", "twins_pcpvt_small", SMALL_TWINS | {"depths": (1, 1, 1, 1)}, 64),
    ("nextvit", "nextvit_small", {"depths": (1, 1, 5, 1)}, 64),
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


# ---- fast: the token order of reduced keys and local windows, by the model's own code ------------------
# Each attention module (a copy) runs on tokens whose channel 0 is their raster index; its reduction is
# made to average channel 0 (a convolution of weights 1 / R², no norm), so the key it projects carries
# the mean index of the tokens it was made from, and a window's rows the index of their token.

def index_tokens(n: int, channels: int):
    import torch

    x = torch.zeros(1, n, channels)
    x[0, :, 0] = torch.arange(n, dtype=torch.float32)
    return x


def mean_of_cells(grid, cells) -> list[float]:
    """Per key, the mean raster index of the tokens of its cell: ``cells`` (rows, cols) ranges, by a plain loop."""
    w = grid[1]
    return [sum(r * w + c for r in rows for c in cols) / (len(rows) * len(cols)) for rows, cols in cells]


def projected_input(attn, projection, run) -> "torch.Tensor":
    """Channel 0 of what ``projection`` (a module of ``attn``) is given when ``run(attn)`` runs."""
    seen = []
    handle = projection.register_forward_pre_hook(lambda _m, args: seen.append(args[0][..., 0].detach()))
    try:
        run(attn)
    finally:
        handle.remove()
    return seen[0]


def averaging(conv) -> None:
    import torch

    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[0, 0] = 1.0 / (conv.weight.shape[-2] * conv.weight.shape[-1])
        if conv.bias is not None:
            conv.bias.zero_()


def reduced_keys_by_model(attn, grid, kv_name: str = "kv"):
    """The mean token index of every key ``attn`` (PVT v2's or Twins' GSA, a copy) makes from ``grid``'s tokens."""
    import copy

    import torch

    attn = copy.deepcopy(attn)
    if getattr(attn, "sr", None) is not None:
        averaging(attn.sr)
        attn.norm = torch.nn.Identity()
    if getattr(attn, "act", None) is not None:
        attn.act = torch.nn.Identity()
    x = index_tokens(grid[0] * grid[1], attn.dim)
    return projected_input(attn, getattr(attn, kv_name), lambda a: a(x, grid))[0]  # (Nk,)


@pytest.mark.parametrize("name, kwargs", [("pvt_v2_b0", {"depths": (1, 1, 1, 1)}),
                                          ("pvt_v2_b2_li", SMALL_PVT_LINEAR)])
def test_pvt_v2_keys_are_the_reduced_grid_in_raster_order(name, kwargs):
    import math

    import timm
    import torch

    from attnviz.adapters import adapter_for

    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    adapter = adapter_for(network, 64)
    assert [lay.grid for lay in adapter.layouts] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    for attn, lay in zip(adapter.attentions, adapter.layouts):
        h, w = lay.grid
        assert lay.windows.tolist() == [list(range(h * w))]  # one window, queries in raster order
        assert lay.keys.tolist() == [list(range(lay.num_keys))]
        kh, kw = lay.keys_grid
        if attn.pool is not None:  # adaptive pooling: bin i covers floor(i·h/7) … ceil((i+1)·h/7) − 1
            assert (kh, kw) == (7, 7)
            bins = [range(i * h // kh, math.ceil((i + 1) * h / kh)) for i in range(kh)]
            cells = [(bins[a], bins[b]) for a in range(kh) for b in range(kw)]
        else:
            r = h // kh
            assert (kh * r, kw * r) == (h, w) and r == (attn.sr.stride[0] if attn.sr is not None else 1)
            cells = [(range(a * r, a * r + r), range(b * r, b * r + r)) for a in range(kh) for b in range(kw)]
        torch.testing.assert_close(reduced_keys_by_model(attn, lay.grid).tolist(), mean_of_cells(lay.grid, cells))


def test_twins_windows_and_sub_sampled_keys_are_the_models_own():
    import timm
    import torch

    from attnviz.adapters import adapter_for
    from timm.models.twins import LocallyGroupedAttn

    network = timm.create_model("twins_svt_small", pretrained=False, **SMALL_TWINS,
                                depths=(2, 2, 2, 2), wss=(4, 4, 2, 2)).eval()
    adapter = adapter_for(network, 64)
    kinds = [type(a).__name__ for a in adapter.attentions]
    assert kinds == ["LocallyGroupedAttn", "GlobalSubSampleAttn"] * 4
    assert [lay.grid for lay in adapter.layouts][::2] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    for attn, lay in zip(adapter.attentions, adapter.layouts):
        if type(attn) is LocallyGroupedAttn:  # the windows qkv projects: the model's own partition
            x = index_tokens(lay.grid[0] * lay.grid[1], attn.dim)
            seen = projected_input(attn, attn.qkv, lambda a: a(x, lay.grid))  # (1, h/ws, w/ws, ws, ws)
            assert lay.windows.tolist() == seen.reshape(lay.num_windows, -1).long().tolist()
            assert lay.window == (attn.ws, attn.ws) and lay.key_windows is None
            (h, w), ws = lay.grid, attn.ws  # and by a plain loop: window (a, b), row (i, j)
            assert lay.windows.tolist() == [[(a * ws + i) * w + b * ws + j for i in range(ws) for j in range(ws)]
                                            for a in range(h // ws) for b in range(w // ws)]
        else:
            h, w = lay.grid
            kh, kw = lay.keys_grid
            r = attn.sr_ratio
            assert lay.windows.tolist() == [list(range(h * w))] and (kh * r, kw * r) == (h, w)
            cells = [(range(a * r, a * r + r), range(b * r, b * r + r)) for a in range(kh) for b in range(kw)]
            torch.testing.assert_close(reduced_keys_by_model(attn, lay.grid).tolist(), mean_of_cells(lay.grid, cells))


def test_nextvit_keys_are_runs_of_raster_tokens_in_bands_of_rows():
    import copy

    import timm
    import torch

    from attnviz.adapters import adapter_for

    network = timm.create_model("nextvit_small", pretrained=False, depths=(1, 2, 5, 1)).eval()
    adapter = adapter_for(network, 96)  # 12 × 12 at stage 2: 16-token runs wrap onto the next row
    assert [(lay.stage, lay.block) for lay in adapter.layouts] == [(1, 1), (2, 4), (3, 0)]
    assert [lay.grid for lay in adapter.layouts] == [(12, 12), (6, 6), (3, 3)]
    assert [lay.keys_grid for lay in adapter.layouts] == [(3, 3), (3, 3), (3, 3)]
    for attn, lay in zip(adapter.attentions, adapter.layouts):
        (h, w), (kh, kw) = lay.grid, lay.keys_grid
        assert lay.windows.tolist() == [list(range(h * w))] and lay.keys.tolist() == [list(range(kh * kw))]
        attn = copy.deepcopy(attn)
        if attn.norm is not None:
            attn.norm = torch.nn.Identity()
        x = index_tokens(h * w, attn.dim)
        keys = projected_input(attn, attn.k, lambda a: a(x))[0]  # (Nk,): the mean index of each key's tokens
        run = attn.N_ratio
        torch.testing.assert_close(keys.tolist(), [j * run + (run - 1) / 2 for j in range(kh * kw)])
        band = h // kh  # key row a is exactly the token rows a · band … (a + 1) · band − 1
        for j in range(kh * kw):
            assert {t // w for t in range(j * run, (j + 1) * run)} <= set(range(j // kw * band, j // kw * band + band))


@pytest.mark.parametrize("name, kwargs, size, sentence", [
    ("pvt_v2_b0", {"depths": (1, 1, 1, 1), "sr_ratios": (3, 1, 1, 1)}, 64, "At 64 px, stage 1 of "
     "PyramidVisionTransformerV2 has a 16 × 16 token grid that its 3 × 3 spatial reduction does not divide, so its "
     "keys leave out the last tokens of the photo; attnviz refuses that size rather than show keys for only part "
     "of it (use a size where every stage divides)."),
    ("pvt_v2_b0", {"depths": (1, 1, 1, 1)}, 80, "The input size must be a multiple of PyramidVisionTransformerV2's "
     "32 px patches; 80 px is not."),
    ("twins_svt_small", SMALL_TWINS | {"depths": (2, 2, 2, 2), "wss": (3, 4, 2, 2)}, 64, "At 64 px, stage 1 of "
     "Twins has a 16 × 16 token grid that does not divide into 3 × 3 windows, so the model pads it with tokens that "
     "are not in the photo; attnviz refuses that size rather than show them (use a size where every stage divides)."),
])
def test_reduced_keys_and_windows_that_leave_out_tokens_are_refused(name, kwargs, size, sentence):
    import timm

    from attnviz import ModelError
    from attnviz.adapters import adapter_for

    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    with pytest.raises(ModelError) as refused:
        adapter_for(network, size)
    assert str(refused.value) == sentence and one_sentence(sentence)


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
