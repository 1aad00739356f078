"""Attention rollout: known answers, and the per-row normalisation that other tools get wrong."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attnviz
from attnviz.rollout import capture_layers, cls_rollout_grid, layer_flow, rollout, rollout_map, rollout_row


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_identity_attention_rolls_out_to_identity():
    eye = torch.eye(5, dtype=torch.float64).expand(3, 5, 5)  # (H, N, N)
    for head in ("mean", "max", "min", 1):
        np.testing.assert_allclose(rollout([eye] * 4, head=head), np.eye(5), atol=1e-12)


def test_three_tokens_two_layers_by_hand():
    layer1 = t([[[0, 1, 0], [0, 1, 0], [0, 0, 1]]])  # (1, 3, 3)
    layer2 = t([[[0, 0, 1], [1, 0, 0], [0, 1, 0]]])
    # A'1 = [[.5,.5,0],[0,1,0],[0,0,1]], A'2 = [[.5,0,.5],[.5,.5,0],[0,.5,.5]]; R = A'2 · A'1
    expected = [[0.25, 0.25, 0.5], [0.25, 0.75, 0.0], [0.0, 0.5, 0.5]]
    np.testing.assert_allclose(rollout([layer1, layer2]), expected, atol=1e-12)
    np.testing.assert_allclose(rollout_row([layer1, layer2], query=1), expected[1], atol=1e-12)
    # Order matters: A'1 · A'2 is a different matrix.
    assert not np.allclose(rollout([layer2, layer1]), expected)


def test_every_row_is_normalised_on_its_own():
    # max over heads leaves rows that do not sum to 1: [[1, 1], [1, 0]].
    heads = t([[[1, 0], [1, 0]], [[0, 1], [1, 0]]])
    flow = layer_flow(heads, "max")
    # 0.5·A + 0.5·I = [[1, .5], [.5, .5]]; row sums 1.5 and 1.0.
    np.testing.assert_allclose(flow, [[2 / 3, 1 / 3], [0.5, 0.5]], atol=1e-12)
    # The known bug, a / a.sum(-1) without keepdim, divides column j by row j's sum instead:
    a = t([[1, 0.5], [0.5, 0.5]])
    assert not np.allclose(flow, a / a.sum(-1))
    assert not np.allclose(flow, a / a.sum())  # nor is one global sum right


def test_discard_drops_lowest_weights_but_never_the_cls_column():
    a = t([[[0.1, 0.2, 0.7], [0.05, 0.9, 0.05], [0.3, 0.3, 0.4]]])
    # 2/9 of 9 weights → the 2 lowest outside column 0: (1, 2) = .05 and (0, 1) = .2; (1, 0) = .05 stays.
    kept = t([[0.1, 0.0, 0.7], [0.05, 0.9, 0.0], [0.3, 0.3, 0.4]])
    mixed = 0.5 * kept + 0.5 * torch.eye(3, dtype=torch.float64)
    expected = mixed / mixed.sum(-1, keepdim=True)
    np.testing.assert_allclose(layer_flow(a, "mean", discard=2 / 9 + 1e-9), expected, atol=1e-12)


def test_residual_weight_is_configurable():
    a = t([[[0, 1], [1, 0]]])
    np.testing.assert_allclose(layer_flow(a, 0, residual=0.0), [[0, 1], [1, 0]], atol=1e-12)
    np.testing.assert_allclose(layer_flow(a, 0, residual=1.0), np.eye(2), atol=1e-12)
    with pytest.raises(ValueError):
        layer_flow(a, 0, discard=1.0)


def numpy_rollout(weights: np.ndarray, head: str = "mean") -> np.ndarray:
    """Independent loop over (L, H, N, N) numpy weights, written entry by entry."""
    n = weights.shape[-1]
    joint = np.eye(n)
    for layer in weights.astype(np.float64):
        fused = {"mean": layer.mean(0), "max": layer.max(0), "min": layer.min(0)}[head]
        flow = 0.5 * fused + 0.5 * np.eye(n)
        for i in range(n):
            flow[i] /= flow[i].sum()
        joint = flow @ joint
    return joint


@pytest.mark.parametrize("head", ["mean", "max", "min"])
def test_capture_rollout_matches_an_independent_numpy_loop(tiny, cat, head):
    cap = attnviz.capture(tiny, cat)
    expected = numpy_rollout(cap.all_weights(), head)
    np.testing.assert_allclose(rollout(capture_layers(cap), head), expected, atol=1e-5)
    grid = rollout_map(cap, head=head)
    np.testing.assert_allclose(grid, expected[0, 1:].reshape(4, 4), atol=1e-5)
    # a sub-range of layers: only the last one
    last = numpy_rollout(cap.all_weights()[1:], head)
    np.testing.assert_allclose(rollout_map(cap, 1, 1, head, query=3), last[3, 1:].reshape(4, 4), atol=1e-5)


def test_cls_rollout_grid_is_the_cli_array(tiny, cat):
    cap = attnviz.capture(tiny, cat)
    grid = cls_rollout_grid(cap)
    assert grid.shape == (4, 4) and grid.dtype == np.float32
    np.testing.assert_allclose(grid, numpy_rollout(cap.all_weights())[0, 1:].reshape(4, 4), atol=1e-5)


def test_registers_are_left_out_of_the_grid(cat):
    from conftest import tiny_vit

    cap = attnviz.capture(tiny_vit(reg_tokens=2), cat)
    expected = numpy_rollout(cap.all_weights())
    np.testing.assert_allclose(cls_rollout_grid(cap), expected[0, 3:].reshape(4, 4), atol=1e-5)


def test_discard_counts_exactly_and_breaks_ties_in_raster_order():
    a = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    flow = layer_flow(a, "mean", discard=2 / 9 + 1e-9, residual=0.0)
    # all weights tie: the first two outside the CLS column, (0, 1) and (0, 2), are dropped
    np.testing.assert_allclose(flow, [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3]], atol=1e-12)
    big = torch.rand(2, 40, 40, dtype=torch.float64)
    zeros = int((layer_flow(big, "mean", discard=0.5, residual=0.0) == 0).sum())
    assert zeros == 800  # exactly half of the 1600 weights
