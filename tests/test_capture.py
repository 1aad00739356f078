"""Captured attention equals an independent recomputation, on both of timm's attention paths."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attnviz
from attnviz.capture import capture_tensor, fuse_heads, patch_grid
from conftest import tiny_vit, Q


def reference_weights(network: torch.nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    """softmax(q·kᵀ/√d_k) per layer in float64, from each block's own input and qkv projection.

    Computed outside timm's Attention.forward: the block input is taken with a pre-hook and the
    projection is applied here by hand.
    """
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach().clone())) for b in network.blocks]
    with torch.no_grad():
        network(x)
    for h in hooks:
        h.remove()
    out = []
    for block, h in zip(network.blocks, inputs):
        a = block.attn
        B, N, C = h.shape
        w, b = a.qkv.weight.double(), a.qkv.bias.double() if a.qkv.bias is not None else 0.0
        qkv = (h.double() @ w.T + b).reshape(B, N, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4)
        q, k = qkv[0][0], qkv[1][0]  # (H, N, d_k)
        scores = q @ k.transpose(-2, -1) / np.sqrt(a.head_dim)
        out.append(torch.softmax(scores, dim=-1).numpy())
    return out


@pytest.mark.parametrize("fused", [True, False])
def test_tiny_vit_weights_match_recomputation_on_both_paths(fused):
    model = tiny_vit(fused=fused)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    cap = capture_tensor(model, x)
    ref = reference_weights(model.network, x)
    assert cap.num_tokens == 17 and cap.num_heads == 4 and cap.num_layers == 2
    for layer in range(2):
        for head in range(4):
            got = cap.weights(layer, head)
            assert got.shape == (17, 17)
            assert np.abs(got - ref[layer][head]).max() <= 1e-5
            np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-6)


def test_real_model_weights_match_recomputation(real_model, cat):
    cap = attnviz.capture(real_model, cat)
    ref = reference_weights(real_model.network, cap.input)
    assert Q(cap).shape == (12, 6, 197, 64)
    worst = max(np.abs(cap.layer_weights(i).numpy() - ref[i]).max() for i in range(12))
    assert worst <= 1e-5
    # and the CLS row of the last layer is a probability distribution over all 197 tokens
    assert cap.row(11, 3).shape == (197,)
    assert abs(cap.row(11, 3).sum() - 1.0) < 1e-5


def test_real_model_matches_hugging_face_dinov2_in_float64(real_model, cat):
    """A second, independent implementation (transformers' eager Dinov2) on the same weights."""
    from bench.peers import hf_dinov2

    x = real_model.to_input(real_model.view(cat)).double()
    network = attnviz.load_model(device="cpu").network.double()  # a private copy: the shared one stays fp32
    model64 = attnviz.wrap(network, "fp64", "test", real_model.size)
    cap = capture_tensor(model64, x)
    with torch.no_grad():
        hf = hf_dinov2().double()(pixel_values=x, output_attentions=True)
    for layer in range(12):
        assert torch.abs(hf.attentions[layer][0] - cap.layer_weights(layer)).max() < 1e-9


def test_capture_leaves_output_unchanged_and_adds_no_hooks(tiny):
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = tiny.network(x)[0]
    cap = capture_tensor(tiny, x)
    assert torch.equal(cap.output, expected)
    # only the hooks wrap() installed: q_norm, k_norm and the block of each layer
    assert sum(len(m._forward_hooks) for m in tiny.network.modules()) == 3 * tiny.depth


def test_prefix_tokens_are_left_out_of_the_grid():
    model = tiny_vit(reg_tokens=4)
    cap = capture_tensor(model, torch.randn(1, 3, 32, 32))
    assert cap.num_prefix_tokens == 5 and cap.num_tokens == 5 + 16
    row = cap.row(1, 2)
    np.testing.assert_array_equal(cap.cls_map(1, 2), row[5:].reshape(4, 4))
    # a patch token as the query: row 5 is patch (0, 0)
    np.testing.assert_array_equal(cap.query_map(0, "mean", 5), cap.row(0, "mean", 5)[5:].reshape(4, 4))


def test_rows_equal_matrix_rows(tiny):
    cap = capture_tensor(tiny, torch.randn(1, 3, 32, 32))
    for head in (0, 3, "mean", "max", "min"):
        np.testing.assert_allclose(cap.row(1, head, 7), cap.weights(1, head)[7], atol=1e-7)


def test_fuse_heads_on_known_values():
    w = torch.tensor([[[0.2, 0.8]], [[0.6, 0.4]]])  # (H=2, 1, 2)
    assert torch.allclose(fuse_heads(w, "mean"), torch.tensor([[0.4, 0.6]]))
    assert torch.allclose(fuse_heads(w, "max"), torch.tensor([[0.6, 0.8]]))
    assert torch.allclose(fuse_heads(w, "min"), torch.tensor([[0.2, 0.4]]))
    assert torch.equal(fuse_heads(w, 1), w[1])
    with pytest.raises(ValueError):
        fuse_heads(w, 2)


def test_patch_grid_raster_order():
    row = np.arange(1 + 6, dtype=float)  # CLS then 2 × 3 patches
    np.testing.assert_array_equal(patch_grid(row, (2, 3), 1), [[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError):
        patch_grid(row, (3, 3), 1)


def test_capture_memory_is_small(real_model, cat):
    cap = attnviz.capture(real_model, cat)
    # queries + keys: 2 × 12 × 197 × 384 × 4 bytes ≈ 7.3 MB, plus the input tensor and the token norms
    assert cap.nbytes == 2 * 12 * 197 * 384 * 4 + 3 * 196 * 196 * 4 + 384 * 4 + 12 * 197 * 4
    assert cap.nbytes <= 8 * 2**20


def test_out_of_range_layer_and_query(tiny):
    cap = capture_tensor(tiny, torch.randn(1, 3, 32, 32))
    with pytest.raises(IndexError):
        cap.weights(2, 0)
    with pytest.raises(IndexError):
        cap.row(0, 0, 17)
