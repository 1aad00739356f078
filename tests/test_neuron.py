"""The neuron view's numbers (attnviz/neuron.py) against the capture's own weights."""
from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch

import attnviz
from attnviz.neuron import neuron_pair

from conftest import tiny_vit, Q, BIAS


def test_every_number_adds_up_to_the_capture_weight():
    model = tiny_vit(seed=6)
    cap = attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    for layer, head, query, key in [(0, 0, 0, 5), (1, 3, 7, 0), (1, 2, 16, 16)]:
        pair = neuron_pair(cap, layer, head, query, key)
        assert pair.product.sum() == pytest.approx(pair.dot, abs=1e-12)
        assert pair.scale == pytest.approx(1 / math.sqrt(8))
        assert pair.logit == pytest.approx(pair.dot * pair.scale + pair.bias, abs=1e-12)
        assert pair.weight == pytest.approx(float(cap.weights(layer, head)[query, key]), abs=1e-6)
        # the q and k are the query and key of the capture, elementwise
        assert np.array_equal(pair.q, Q(cap)[layer, head, query].double().numpy())
    with pytest.raises(IndexError):
        neuron_pair(cap, 0, 4, 0, 0)


def test_the_bias_of_relative_position_models_is_in_the_logit():
    torch.manual_seed(0)
    network = timm.create_model("vit_relpos_small_patch16_224", pretrained=False, num_classes=3, img_size=32,
                                depth=1, embed_dim=32, num_heads=2).eval()
    model = attnviz.wrap(network, "relpos", "random init", 32)
    cap = attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32))
    pair = neuron_pair(cap, 0, 1, 1, 3)
    assert pair.bias == pytest.approx(float(BIAS(cap)[0, 1, 1, 3]), abs=1e-12) and pair.bias != 0.0
    assert pair.weight == pytest.approx(float(cap.weights(0, 1)[1, 3]), abs=1e-6)


def test_real_model_pair(real_model):
    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample("cat"), real_model).image)
    pair = neuron_pair(cap, 11, 2, 0, 1 + 7 * 14 + 7)
    assert pair.q.shape == (64,) and pair.bias == 0.0
    assert pair.weight == pytest.approx(float(cap.weights(11, 2)[0, 1 + 7 * 14 + 7]), abs=1e-6)
