"""Hiera and HieraDet (SAM 2's Hiera) (issue #22): mask-unit / windowed attention with pooled queries.

The layouts' windows and keys are checked against the models' own token order: Hiera's ``Unroll`` of an
arange raster grid and its residual max-pool (``x.view(B, q_stride, −1, C).amax(1)``) of the unrolled
row and column coordinates (the adapter reads Hiera's ``Reroll`` instead), HieraDet's ``q_pool`` of the
coordinates of each window, and plain loops over the mask units and windows."""
from __future__ import annotations

import pytest

from tests.test_zoo import SMALL_HIERA, SMALL_HIERADET
from tests.zoo import one_sentence


def small_capture(name: str, kwargs: dict, size: int):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    model = attnviz.wrap(network, name, "random init", size)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    return network, model, x, capture_tensor(model, x)


def test_hiera_windows_are_its_unrolled_mask_units_and_pooled_queries():
    import torch

    network, _, _, cap = small_capture("hiera_tiny_224", SMALL_HIERA, 224)
    # stages (1, 2, 2, 1): pooled queries at blocks 1, 3, 5; mask units at blocks 0-3, global after
    assert cap.stages == ((0,), (1, 2), (3, 4), (5,))
    assert [cap.layout(i).grid for i in range(6)] == [(56, 56), (28, 28), (28, 28), (14, 14), (14, 14), (7, 7)]
    assert [cap.layout(i).keys_grid for i in range(6)] == [(56, 56), (56, 56), (28, 28), (28, 28), (14, 14), (14, 14)]
    assert [cap.layout(i).num_windows for i in range(6)] == [49, 49, 49, 49, 1, 1]
    assert [cap.layout(i).windows.shape[1] for i in range(6)] == [64, 16, 16, 4, 196, 49]
    assert [cap.layout(i).keys.shape[1] for i in range(6)] == [64, 64, 16, 16, 196, 196]

    # The model's own Unroll of an arange raster grid: position n of the sequence holds raster cell unrolled[n].
    n = 56 * 56
    rows = network.unroll((torch.arange(n) // 56).double().view(1, n, 1)).reshape(-1)
    cols = network.unroll((torch.arange(n) % 56).double().view(1, n, 1)).reshape(-1)
    unrolled = (rows * 56 + cols).long()
    w = 49  # position n is row n // W of mask unit n % W (MaskUnitAttention's reshape(B, -1, W, ...))
    first = cap.layout(0)
    assert first.windows.tolist() == unrolled.reshape(-1, w).T.tolist()
    for window, cells in enumerate(first.windows.tolist()):  # every window is one 8 × 8 mask unit
        assert sorted(cells) == sorted(r * 56 + c for r in range(8 * (window // 7), 8 * (window // 7) + 8)
                                       for c in range(8 * (window % 7), 8 * (window % 7) + 8))
    # Block 1 pools: its keys are block 0's tokens, its queries the residual's max-pool of the sequence,
    # which takes cells (2i, 2j) … (2i + 1, 2j + 1) to (i, j) of the 28 × 28 grid.
    pool = network.blocks[1].attn.q_stride
    pooled_rows = rows.view(1, pool, -1, 1).amax(1).reshape(-1).long() // 2
    pooled_cols = cols.view(1, pool, -1, 1).amax(1).reshape(-1).long() // 2
    pooled = pooled_rows * 28 + pooled_cols  # position n' of block 1's output: its raster cell on 28 × 28
    down = cap.layout(1)
    assert down.keys.tolist() == first.windows.tolist()
    assert down.windows.tolist() == pooled.reshape(-1, w).T.tolist()
    for window, cells in enumerate(down.windows.tolist()):  # the same mask unit, 4 × 4 cells of the 28 grid
        assert sorted(cells) == sorted(r * 28 + c for r in range(4 * (window // 7), 4 * (window // 7) + 4)
                                       for c in range(4 * (window % 7), 4 * (window % 7) + 4))
    # Global layers: one window of every token, in the sequence's order.
    glob = cap.layout(4)
    assert sorted(glob.windows[0].tolist()) == list(range(196)) and glob.key_windows is None
    assert sorted(cap.layout(5).keys[0].tolist()) == list(range(196))
    assert sorted(cap.layout(5).windows[0].tolist()) == list(range(49))
    assert cap.summary == "mean_received" and not cap.has_class_token


def test_hiera_token_norms_are_in_raster_order():
    import torch

    network, model, x, cap = small_capture("hiera_tiny_224", SMALL_HIERA, 224)
    outputs = {}
    handles = [network.blocks[i].register_forward_hook(lambda m, a, out, i=i: outputs.__setitem__(i, out))
               for i in (0, 3)]
    with torch.no_grad():
        network(x)
    for h in handles:
        h.remove()
    for i in (0, 3):  # the model's own Reroll puts block i's output on its grid
        spatial = network.reroll(outputs[i], i)[0]  # (h, w, C)
        assert torch.allclose(cap.token_norms[i], spatial.norm(dim=-1).reshape(-1), atol=1e-5)


def test_hieradet_windows_are_its_window_partition_and_pooled_queries():
    import torch

    network, _, _, cap = small_capture("sam2_hiera_tiny", SMALL_HIERADET, 224)
    # stages (1, 2, 2, 1), window_spec (8, 4, 14, 7), block 4 global; pooled queries at blocks 1, 3, 5
    assert cap.stages == ((0,), (1, 2), (3, 4), (5,))
    assert [cap.layout(i).grid for i in range(6)] == [(56, 56), (28, 28), (28, 28), (14, 14), (14, 14), (7, 7)]
    assert [cap.layout(i).keys_grid for i in range(6)] == [(56, 56), (56, 56), (28, 28), (28, 28), (14, 14), (14, 14)]
    assert [cap.layout(i).num_windows for i in range(6)] == [49, 49, 49, 49, 1, 1]
    assert [cap.layout(i).windows.shape[1] for i in range(6)] == [64, 16, 16, 4, 196, 49]
    assert [cap.layout(i).keys.shape[1] for i in range(6)] == [64, 64, 16, 16, 196, 196]

    def loop(side: int, ws: int) -> list[list[int]]:  # windows in row-major order, raster inside each
        per = side // ws
        return [[(a * ws + r) * side + b * ws + c for r in range(ws) for c in range(ws)]
                for a in range(per) for b in range(per)]

    for layer, (side, ws) in enumerate([(56, 8), (28, 4), (28, 4), (14, 2)]):
        assert cap.layout(layer).windows.tolist() == loop(side, ws)
    for layer, (side, ws) in enumerate([(56, 8), (56, 8), (28, 4), (28, 4)]):
        assert cap.layout(layer).keys.tolist() == loop(side, ws)
    # The attention's own q_pool of each key window's row and column coordinates: query t of window w
    # pools key cells (2i, 2j) … (2i + 1, 2j + 1) of the key grid into cell (i, j) of the query grid.
    for layer in (1, 3, 5):
        lay, attn = cap.layout(layer), network.blocks[layer].attn
        (_, kw), (_, qw) = lay.keys_grid, lay.grid
        keys = lay.keys  # (W, Tk)
        side = round(keys.shape[1] ** 0.5)
        coords = torch.stack([keys // kw, keys % kw], 1).double().reshape(-1, 2, side, side)  # (W, 2, ws, ws)
        pooled = attn.q_pool(coords).reshape(keys.shape[0], 2, -1).long() // 2  # (W, 2, Tq)
        assert lay.windows.tolist() == (pooled[:, 0] * qw + pooled[:, 1]).tolist()
    assert cap.layout(4).windows.tolist() == [list(range(196))] and cap.layout(4).key_windows is None


def test_hieradet_refuses_a_size_that_pads_its_windows():
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model("sam2_hiera_tiny", pretrained=False, **SMALL_HIERADET).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "sam2_hiera_tiny", "random init", 256)  # block 6: 16 × 16 in 14 × 14 windows
    assert str(error.value) == (
        "At 256 px, block 6 of HieraDet has a 16 × 16 token grid that does not divide into 14 × 14 windows, so the "
        "model pads it with tokens that are not in the photo; attnviz refuses that size rather than show them "
        "(use a size where every stage divides).")
    assert one_sentence(str(error.value))


def test_hiera_refuses_a_size_it_was_not_built_for():
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model("hiera_tiny_224", pretrained=False, **SMALL_HIERA).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "hiera_tiny_224", "random init", 256)
    assert str(error.value) == ("Hiera was built for 224 px inputs, not 256 px (its position embedding and token "
                                "order are fixed to a 56 × 56 token grid); build it with img_size=256.")
    assert one_sentence(str(error.value))
