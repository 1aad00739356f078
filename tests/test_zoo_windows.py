"""Swin V2 (cr) and NesT (issue #22): their windows are the models' own partition (timm's
``window_partition`` after the block's roll; NesT's ``blockify`` at every level), and each stage's
tokens are its output map's cells in raster order."""
from __future__ import annotations

from tests.test_zoo import SMALL_SWIN


def wrapped_capture(name: str, size: int, **kwargs):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, img_size=size, **kwargs).eval()
    model = attnviz.wrap(network, name, "random init", size)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    return network, x, capture_tensor(model, x)


def stage_outputs(network, stages, x):
    """Each stage's (C, h, w) output, from a plain forward pass with hooks of the test's own."""
    import torch

    out = []
    handles = [s.register_forward_hook(lambda _m, _i, o: out.append(o[0])) for s in stages]
    with torch.no_grad():
        network(x)
    for h in handles:
        h.remove()
    return out


def test_swin_cr_windows_are_the_models_own_partition_after_its_shift():
    import torch
    from timm.models.swin_transformer_v2_cr import window_partition

    network, x, cap = wrapped_capture("swinv2_cr_tiny_224", 128, **SMALL_SWIN)
    blocks = [b for stage in network.stages for b in stage.blocks]
    assert cap.stages == ((0, 1), (2, 3)) and len(blocks) == 4
    assert [cap.layout(i).grid for i in range(4)] == [(32, 32), (32, 32), (16, 16), (16, 16)]
    assert [cap.layout(i).patch for i in range(4)] == [4, 4, 8, 8]
    for layer, block in enumerate(blocks):
        lay = cap.layout(layer)
        h, w = lay.grid
        grid = torch.arange(h * w).reshape(1, h, w, 1)
        sh, sw = block.shift_size  # what _shifted_window_attn rolls by, then window_partition
        expected = window_partition(torch.roll(grid, shifts=(-sh, -sw), dims=(1, 2)), block.window_size)
        assert lay.windows.tolist() == expected.reshape(-1, lay.windows.shape[1]).tolist()
    assert cap.layout(0).shift == (0, 0) and cap.layout(1).shift == (2, 2)  # window 4 (1/8 of the 32 grid)
    # each stage's last block's tokens are its output map's cells in raster order
    for layer, out in zip((1, 3), stage_outputs(network, network.stages, x)):
        torch.testing.assert_close(cap.token_norms[layer], out.norm(dim=0).reshape(-1))


def test_nest_windows_are_the_models_own_blocks_at_every_level():
    import torch
    from timm.models.nest import blockify

    network, x, cap = wrapped_capture("nest_tiny", 64)
    assert cap.stages == ((0, 1), (2, 3), tuple(range(4, 12)))
    assert [cap.layout(i).grid for i in (0, 2, 4)] == [(16, 16), (8, 8), (4, 4)]
    assert [cap.layout(i).patch for i in (0, 2, 4)] == [4, 8, 16]
    assert [cap.layout(i).num_windows for i in (0, 2, 4)] == [16, 4, 1]  # the last level: one block
    for layer in range(cap.num_layers):
        lay = cap.layout(layer)
        h, w = lay.grid
        expected = blockify(torch.arange(h * w).reshape(1, h, w, 1), network.block_size)  # (1, blocks, N, 1)
        assert lay.windows.tolist() == expected[0, :, :, 0].tolist()
    # each level's last layer's tokens are the level's output map's cells in raster order
    last = [i for i, lay in enumerate(cap.layouts) if i + 1 == cap.num_layers or cap.layouts[i + 1].stage != lay.stage]
    for layer, out in zip(last, stage_outputs(network, network.levels, x)):
        torch.testing.assert_close(cap.token_norms[layer], out.norm(dim=0).reshape(-1))
