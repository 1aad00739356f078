"""TNT (issue #22): the inner attention's windows are the model's own pixel tokens of each patch, laid on
the fine pixel grid in the order timm's PixelEmbed (nn.Unfold, then a strided convolution, or the
reverse in the legacy models) puts them; the outer attention is one window of the class token and patches."""
from __future__ import annotations

import pytest

SMALL_TNT = {"depth": 2, "img_size": 64}  # 4 × 4 patches of 16 px, each 4 × 4 pixel tokens: a 16 × 16 fine grid


def small_capture(name: str, peaked: bool = False):
    import timm
    import torch

    import attnviz
    from attnviz.capture import capture_tensor
    from tests.zoo import peak

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **SMALL_TNT).eval()
    if peaked:
        peak(network)
    model = attnviz.wrap(network, name, "random init", 64)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    return network, x, capture_tensor(model, x)


def pixel_order(embed) -> list[list[int]]:
    """Which fine-grid cell each pixel token of each patch is, by the model's own PixelEmbed geometry on an
    image whose values are fine-grid cell indices (every stride × stride square one index)."""
    import torch
    import torch.nn.functional as F

    stride = embed.proj.stride[0]
    side = embed.new_patch_size[0]
    s = embed.img_size[0]
    fine = s // stride
    cells = torch.arange(fine * fine, dtype=torch.float64).reshape(1, 1, fine, fine)
    # a copy of the convolution's geometry that picks the pixel at the kernel's centre: output (i, j) is
    # the fine cell its window is centred on
    k = embed.proj.kernel_size[0]
    delta = torch.zeros(1, 1, k, k, dtype=torch.float64)
    delta[0, 0, k // 2, k // 2] = 1.0

    def conv(x):
        return F.conv2d(x, delta, stride=embed.proj.stride, padding=embed.proj.padding)

    if embed.legacy:  # the convolution on the whole photo, then nn.Unfold of p × p pieces of its map
        image = cells.repeat_interleave(stride, 2).repeat_interleave(stride, 3)
        x = embed.unfold(conv(image))  # (1, p², N)
        x = x.transpose(1, 2).reshape(-1, 1, side, side)
    else:  # nn.Unfold of the photo's patches, then the convolution on each patch
        image = cells.repeat_interleave(stride, 2).repeat_interleave(stride, 3)
        x = embed.unfold(image)  # (1, patch², N)
        x = x.transpose(1, 2).reshape(-1, 1, *embed.patch_size)
        x = conv(x)  # (N, 1, p, p)
    # PixelEmbed.forward: x.reshape(B · N, in_dim, −1).transpose(1, 2): row t of patch n is pixel t in raster order
    return x.reshape(x.shape[0], -1).round().long().tolist()


@pytest.mark.parametrize("name", ["tnt_s_patch16_224", "tnt_s_legacy_patch16_224"])
def test_tnt_pixel_windows_are_the_models_own_unfold_on_the_fine_grid(name):
    import torch

    network, x, cap = small_capture(name)
    embed = network.pixel_embed
    assert embed.legacy == ("legacy" in name)
    assert cap.stages == ((0, 2), (1, 3))  # per TNT block: inner, then outer
    inner = cap.layout(0)
    assert inner.grid == (16, 16) and inner.window == (4, 4) and inner.patch == 4 and inner.prefix == 0
    assert inner.windows.shape == (16, 16)  # one window per patch, 16 pixel tokens each
    assert inner.windows.tolist() == pixel_order(embed)
    for layer in (0, 2):
        assert torch.equal(cap.layout(layer).windows, inner.windows)
        assert cap.layout(layer).block == layer // 2 and cap.layout(layer).num_heads == 4
    # the pixel tokens' norms, read from the block's output (N, p², C), land on those windows' cells
    outs = []
    hooks = [b.register_forward_hook(lambda _m, _i, out: outs.append(out[0])) for b in network.blocks]
    with torch.no_grad():
        network(x)
    for h in hooks:
        h.remove()
    for b, out in enumerate(outs):
        norms = torch.zeros(256)
        norms[inner.windows.reshape(-1)] = out.norm(dim=-1).reshape(-1)
        torch.testing.assert_close(cap.token_norms[2 * b], norms)


def test_tnt_outer_layers_are_one_window_of_the_class_token_and_patches():

    from tests.zoo import eager_softmaxes

    network, x, cap = small_capture("tnt_s_patch16_224", peaked=True)
    reference = eager_softmaxes(network, x)  # per block: (patches, H_in, 16, 16), then (1, H_out, 17, 17)
    assert [tuple(r.shape) for r in reference] == [(16, 4, 16, 16), (1, 6, 17, 17)] * 2
    for layer in (1, 3):
        lay = cap.layout(layer)
        assert lay.stage == 1 and lay.grid == (4, 4) and lay.patch == 16
        assert lay.prefix == 1 and lay.class_token and lay.windows.tolist() == [list(range(17))]
        assert cap.summary_kind(layer) == "cls"
        for head in range(6):
            assert abs(cap.cls_map(layer, head) - reference[layer][0, head, 0, 1:].reshape(4, 4).numpy()).max() < 1e-5
    for layer in (0, 2):  # each window's block is its patch's softmax, on the fine grid
        lay = cap.layout(layer)
        full = cap.layer_weights(layer)
        for w in range(16):
            rows = lay.windows[w]
            assert (full[:, rows[:, None], rows[None, :]] - reference[layer][w]).abs().max() < 1e-5
        assert cap.summary_kind(layer) == "mean_received"
    assert max(float(r.max()) for r in reference) > 0.5


def test_tnt_refuses_a_size_it_was_not_built_for():
    import timm

    import attnviz
    from attnviz import ModelError

    network = timm.create_model("tnt_s_patch16_224", pretrained=False, **SMALL_TNT).eval()
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "tnt_s_patch16_224", "random init", 96)
    assert str(error.value) == ("TNT was built for 64 px inputs (its position embedding is a fixed 4 × 4 grid), "
                                "not 96 px; build it with img_size=96.")
