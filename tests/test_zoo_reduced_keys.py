"""PVT v2, Twins and Next-ViT (issue #22): keys from a spatially reduced grid and Twins' local windows,
in the models' own token order."""
from __future__ import annotations

import pytest

from tests.test_zoo import SMALL_PVT_LINEAR, SMALL_TWINS
from tests.zoo import one_sentence


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


def projected_input(attn, projection, run):
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
