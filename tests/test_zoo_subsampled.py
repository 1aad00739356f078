"""LeViT and EfficientFormer V2 (issue #22): sub-sampled queries over the full key grid, checked
against the models' own sub-sampling of an arange grid; the learned bias at each (query, key) offset;
EfficientFormer V2's talking-heads mix."""
from __future__ import annotations

import pytest

from tests.test_zoo import SMALL_EFV2, SMALL_LEVIT
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
    return network, capture_tensor(model, x)


def arange_grid(grid, channels_last: bool):
    """(1, h · w, 1) or (1, 1, h, w) float: every cell holds its raster index."""
    import torch

    cells = torch.arange(grid[0] * grid[1], dtype=torch.float32)
    return cells.reshape(1, -1, 1) if channels_last else cells.reshape(1, 1, *grid)


def check_subsampled_queries(lay, sub, channels_last: bool) -> None:
    """The model's own sub-sampling ``sub`` of an arange key grid: the key cell of each query, in the
    model's order; the layout's query token t (row t of its one window) must be raster cell t of its grid,
    the key token s raster cell s of the key grid, and query (i, j) at key cell (2i, 2j)."""
    cells = sub(arange_grid(lay.keys_grid, channels_last)).reshape(-1).long()
    assert cells.numel() == lay.num_tokens
    gh, gw = lay.grid
    kw = lay.keys_grid[1]
    assert cells.tolist() == [2 * i * kw + 2 * j for i in range(gh) for j in range(gw)]
    assert lay.windows.tolist() == [list(range(lay.num_tokens))]
    assert lay.keys.tolist() == [list(range(lay.num_keys))]


@pytest.mark.parametrize("name", ["levit_128s", "levit_conv_128s"])
def test_levit_layers_are_stages_with_sub_sampled_queries(name):
    from timm.models.levit import AttentionDownsample

    network, cap = small_capture(name, SMALL_LEVIT, 112)
    assert cap.stages == ((0,), (1, 2))
    assert [cap.layout(i).grid for i in range(3)] == [(7, 7), (4, 4), (4, 4)]
    assert [cap.layout(i).keys_grid for i in range(3)] == [(7, 7), (7, 7), (4, 4)]
    assert [cap.heads(i) for i in range(3)] == [2, 4, 3]  # the downsampling layer: in_dim // key_dim heads
    down = network.stages[1].downsample.attn_downsample
    assert type(down) is AttentionDownsample
    check_subsampled_queries(cap.layout(1), down.q.down, channels_last=not network.use_conv)
    for layer in (0, 2):  # global attention: every token of the grid, in raster order, one window
        lay = cap.layout(layer)
        assert lay.windows.tolist() == [list(range(lay.num_tokens))] and lay.key_windows is None
    # the bias is the model's table at |Δrow| · key width + |Δcolumn| of the query's and key's cells
    lay, bias = cap.layout(1), cap.bias[1][0]  # (H, 16, 49)
    table = down.attention_biases
    for t, (i, j) in enumerate((i, j) for i in range(4) for j in range(4)):
        for u, (a, b) in enumerate((a, b) for a in range(7) for b in range(7)):
            assert bias[:, t, u].tolist() == table[:, abs(2 * i - a) * 7 + abs(2 * j - b)].tolist()
    assert cap.summary == "mean_received" and not cap.has_class_token


def test_efficientformer_v2_layers_are_strided_and_sub_sampled():
    import torch
    from timm.models.efficientformer_v2 import Attention2d, Attention2dDownsample

    network, cap = small_capture("efficientformerv2_s0", SMALL_EFV2, 128)
    assert cap.stages == ((0,), (1, 2))
    assert [cap.layout(i).stage for i in range(3)] == [2, 3, 3]
    assert [cap.layout(i).grid for i in range(3)] == [(4, 4), (4, 4), (4, 4)]
    assert [cap.layout(i).keys_grid for i in range(3)] == [(4, 4), (8, 8), (4, 4)]
    strided = network.stages[2].blocks[1].token_mixer
    assert type(strided) is Attention2d and strided.stride_conv is not None
    # stage 3's attention: its queries and keys are the strided convolution's output cells, in raster order
    with torch.no_grad():
        assert strided.stride_conv(torch.zeros(1, strided.q.conv.in_channels, 8, 8)).shape[-2:] == (4, 4)
    lay = cap.layout(0)
    assert lay.windows.tolist() == [list(range(16))] and lay.key_windows is None
    down = network.stages[3].downsample.attn
    assert type(down) is Attention2dDownsample
    check_subsampled_queries(cap.layout(1), down.q.pool, channels_last=False)  # q = local conv + pool, stride 2
    # the mix and the bias: talking_head1 applied to the model's table, as the model applies it to its logits
    mix = strided.talking_head1.weight[:, :, 0, 0]
    assert torch.equal(cap.mix[0], mix) and cap.mix[1] is None and torch.equal(cap.mix[2], network.stages[
        3].blocks[1].token_mixer.talking_head1.weight[:, :, 0, 0])
    with torch.no_grad():
        table = strided.attention_biases[:, strided.attention_bias_idxs]
        torch.testing.assert_close(cap.bias[0][0], strided.talking_head1(table[None])[0], rtol=0, atol=1e-6)
    bias, table = cap.bias[1][0], down.attention_biases  # (H, 16, 64)
    for t, (i, j) in enumerate((i, j) for i in range(4) for j in range(4)):
        for u, (a, b) in enumerate((a, b) for a in range(8) for b in range(8)):
            assert bias[:, t, u].tolist() == table[:, abs(2 * i - a) * 8 + abs(2 * j - b)].tolist()


@pytest.mark.parametrize("name, kwargs, size, sentence", [
    ("levit_128s", SMALL_LEVIT, 224, "LevitDistilled was built for 112 × 112 px inputs, not 224 px (its attention "
     "biases are tables for a 7 × 7 token grid); build it with img_size=224."),
    ("levit_conv_128s", SMALL_LEVIT, 120, "The input size must be a multiple of LevitDistilled's 16 px patches; "
     "120 px is not."),
    ("efficientformerv2_s0", SMALL_EFV2, 120, "attnviz reads EfficientFormerV2 at sizes that are a multiple of "
     "32 px, where every stage's tokens are whole squares of the photo; 120 px is not."),
    ("efficientformerv2_s0", SMALL_EFV2, 160, "EfficientFormerV2 was built for another input size than 160 px "
     "(its attention in stage 3 is on a 4 × 4 grid, not 5 × 5); build it with img_size=160."),
])
def test_levit_and_efficientformer_v2_refuse_sizes_they_were_not_built_for(name, kwargs, size, sentence):
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, name, "random init", size)
    assert str(error.value) == sentence and one_sentence(sentence)
