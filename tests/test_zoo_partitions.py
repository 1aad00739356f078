"""MaxViT, CoAtNet and GC ViT (issue #22): block and grid partitions and GC ViT's windows are timm's own
(its window_partition / grid_partition on an arange grid); GC ViT's odd blocks take the global query."""
from __future__ import annotations


from tests.test_zoo import SMALL_GCVIT
from tests.zoo import one_sentence, walk_one


def staged_layouts(name: str, kwargs: dict, size: int):
    import timm
    import torch

    import attnviz

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    return network, attnviz.wrap(network, name, "random init", size).adapter.layouts


def partitioned(partition, grid: tuple[int, int], size) -> list[list[int]]:
    """A timm partition function applied to the (1, h, w, 1) grid of token indices: (W, T) as lists."""
    import torch

    tokens = torch.arange(grid[0] * grid[1]).reshape(1, *grid, 1)
    return partition(tokens, list(size)).reshape(-1, size[0] * size[1]).tolist()


def test_maxvit_block_and_grid_layers_are_timms_own_partitions():
    from timm.models.maxxvit import grid_partition, window_partition

    network, layouts = staged_layouts("maxvit_pico_rw_256", {"depths": (1, 2, 1, 1), "img_size": 128}, 128)
    blocks = [p for s in network.stages for b in s.blocks for p in (b.attn_block, b.attn_grid)]
    assert len(layouts) == len(blocks) == 10
    assert [(lay.stage, lay.block) for lay in layouts[:6]] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert [lay.grid for lay in layouts[::2]] == [(32, 32), (16, 16), (16, 16), (8, 8), (4, 4)]
    for lay, part in zip(layouts, blocks):
        assert lay.window == (4, 4) and lay.patch == 128 // lay.grid[0]
        partition = window_partition if part.partition_block else grid_partition
        assert lay.windows.tolist() == partitioned(partition, lay.grid, lay.window)
        assert lay.key_windows is None
    # a grid window's tokens are h/G rows and w/G columns apart: window 0 of stage 1 is rows and columns 0, 4, 8, 12
    assert layouts[1].windows[0].tolist()[:4] == [0, 8, 16, 24] and layouts[3].windows[0][:4].tolist() == [0, 4, 8, 12]


def test_coatnet_transformer_layers_are_one_window_of_their_stages_whole_grid():
    network, layouts = staged_layouts("coatnet_pico_rw_224", {"depths": (1, 1, 2, 1), "img_size": 64}, 64)
    assert [(lay.stage, lay.block, lay.grid) for lay in layouts] == [(2, 0, (4, 4)), (2, 1, (4, 4)), (3, 0, (2, 2))]
    for lay in layouts:
        assert lay.windows.tolist() == [list(range(lay.grid[0] * lay.grid[1]))] and lay.patch == 64 // lay.grid[0]
    result = walk_one("maxxvit", "coatnet_pico_rw_224", {"depths": (1, 1, 2, 1), "img_size": 64}, 128)
    assert result.status == "refused" and one_sentence(result.detail)
    assert result.detail == ("MaxxVit's transformer blocks in stage 3 have a position bias for a 4 × 4 token grid, "
                             "not the 8 × 8 grid of 128 px inputs; build it with img_size=128.")


def test_gcvit_layers_are_timms_own_windows_with_global_queries_in_odd_blocks():
    from timm.models.gcvit import window_partition

    network, layouts = staged_layouts("gcvit_xxtiny", SMALL_GCVIT | {"img_size": 128}, 128)
    assert [(lay.stage, lay.block) for lay in layouts] == [(s, b) for s, d in enumerate((2, 2, 6, 2)) for b in range(d)]
    blocks = [b for s in network.stages for b in s.blocks]
    for lay, block in zip(layouts, blocks):
        assert lay.windows.tolist() == partitioned(lambda x, w: window_partition(x, tuple(w)), lay.grid, lay.window)
        assert block.attn.use_global == (lay.block % 2 == 1)
    assert [lay.grid for lay in layouts[::2]] == [(32, 32), (16, 16), (8, 8), (8, 8), (8, 8), (4, 4)]


def test_gcvit_refuses_a_size_it_was_not_built_for():
    result = walk_one("gcvit", "gcvit_xxtiny", SMALL_GCVIT, 128)
    assert result.status == "refused"
    assert result.detail == ("GlobalContextVit was built for 64 px inputs, not 128 px, and the grid of its global queries "
                             "is fixed when it is built; build it with img_size=128.")
