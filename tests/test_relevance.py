"""Chefer et al. 2021 class-specific relevance, checked against independent computations."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F

import attnviz
from attnviz.relevance import RelevanceError, attention_forward, class_relevance, relevance_map


def hand_forward(sd: dict, x: torch.Tensor, heads: int, patch: int):
    """A float64 ViT forward written from the paper's equations and the raw state dict."""
    sd = {k: v.double() for k, v in sd.items()}
    tokens = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=patch)
    tokens = tokens.flatten(2).transpose(1, 2)[0]  # (P, D)
    d = tokens.shape[-1]
    tokens = torch.cat([sd["cls_token"][0], tokens]) + sd["pos_embed"][0]  # (N, D)
    n, dk = tokens.shape[0], d // heads
    attentions = []
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    for i in range(depth):
        p = lambda name: sd[f"blocks.{i}.{name}"]  # noqa: E731
        h = F.layer_norm(tokens, (d,), p("norm1.weight"), p("norm1.bias"), eps=1e-6)
        qkv = (h @ p("attn.qkv.weight").T + p("attn.qkv.bias")).reshape(n, 3, heads, dk)
        q, k, v = (qkv[:, j].transpose(0, 1) for j in range(3))  # (H, N, d_k)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(dk), dim=-1)  # (H, N, N)
        attentions.append(a)
        out = (a @ v).transpose(0, 1).reshape(n, d)
        tokens = tokens + out @ p("attn.proj.weight").T + p("attn.proj.bias")
        h = F.layer_norm(tokens, (d,), p("norm2.weight"), p("norm2.bias"), eps=1e-6)
        h = F.gelu(h @ p("mlp.fc1.weight").T + p("mlp.fc1.bias"))
        tokens = tokens + h @ p("mlp.fc2.weight").T + p("mlp.fc2.bias")
    cls = F.layer_norm(tokens, (d,), sd["norm.weight"], sd["norm.bias"], eps=1e-6)[0]
    return cls @ sd["head.weight"].T + sd["head.bias"], attentions


def loop_relevance(attentions, gradients) -> np.ndarray:
    """R ← R + Ā·R from R = I, Ā = mean_h max(∇A ⊙ A, 0), in plain numpy."""
    n = attentions[0].shape[-1]
    r = np.eye(n)
    for a, g in zip(attentions, gradients):
        a, g = np.asarray(a, np.float64).reshape(-1, n, n), np.asarray(g, np.float64).reshape(-1, n, n)
        bar = np.maximum(a * g, 0.0).mean(axis=0)
        r = r + bar @ r
    return r


def test_tiny_vit_relevance_equals_a_float64_hand_written_forward(tiny, cat):
    cap = attnviz.capture(tiny, cat)
    x = cap.input.double().clone().requires_grad_(True)
    logits, attentions = hand_forward(tiny.network.state_dict(), x, heads=4, patch=8)
    np.testing.assert_allclose(logits.detach(), tiny.network(cap.input)[0].double().detach(), atol=1e-5)
    c = int(logits.argmax())
    grads = torch.autograd.grad(logits[c], attentions)
    expected = loop_relevance([a.detach() for a in attentions], grads)

    double = attnviz.wrap(copy.deepcopy(tiny.network).double(), "tiny64", "test", 32)
    np.testing.assert_allclose(class_relevance(double, cap.input.double(), c), expected, atol=1e-10)
    got32 = relevance_map(tiny, cap, c)  # the float32 model used by the app
    np.testing.assert_allclose(got32, expected[0, 1:].reshape(4, 4), rtol=1e-3, atol=1e-6)
    # a different class gives a different map
    other = (c + 1) % 10
    assert not np.allclose(relevance_map(tiny, cap, other), got32, atol=1e-6)


def real_architecture() -> attnviz.Model:
    """timm's DeiT-III small (LayerScale, position embedding without the CLS slot), random weights."""
    torch.manual_seed(1)
    network = timm.create_model("deit3_small_patch16_224", pretrained=False, num_classes=1000)
    with torch.no_grad():
        for block in network.blocks:  # random init puts LayerScale at 1e-6; make the blocks count
            block.ls1.gamma.uniform_(0.5, 1.5)
            block.ls2.gamma.uniform_(0.5, 1.5)
    return attnviz.wrap(network, "deit3", "random init", 224)


def test_eager_forward_equals_timm_on_a_real_architecture(cat):
    model = real_architecture()
    assert model.network.blocks[0].attn.fused_attn  # the shared model keeps timm's fused path
    x = model.to_input(model.view(cat))
    with torch.no_grad():
        expected = model.network(x)
        logits, attentions = attention_forward(model.network, x)
    assert len(attentions) == 12 and attentions[0].shape == (1, 6, 197, 197)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)
    cap = attnviz.capture(model, cat)  # the captured attention is the same attention
    np.testing.assert_allclose(attentions[5][0], cap.layer_weights(5), atol=1e-6)


def test_real_architecture_relevance_equals_timm_eager_gradients(cat):
    model = real_architecture()
    cap = attnviz.capture(model, cat)
    c = int(cap.output.argmax())
    # Independent: timm's own eager path on a private copy, attention caught at attn_drop.
    twin = copy.deepcopy(model.network)
    caught = []
    for block in twin.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda _m, _i, out: caught.append(out))
    x = cap.input.clone().requires_grad_(True)
    logits = twin(x)
    grads = torch.autograd.grad(logits[0, c], caught)
    expected = loop_relevance([a.detach() for a in caught], grads)
    got = relevance_map(model, cap, c)
    np.testing.assert_allclose(got, expected[0, 1:].reshape(14, 14), rtol=1e-3, atol=1e-6)
    assert model.network.blocks[0].attn.fused_attn  # the shared model was not touched
    assert not any(p.requires_grad for p in model.network.parameters())


def test_registers_and_inference_mode(cat):
    from conftest import tiny_vit

    model = tiny_vit(reg_tokens=2)
    cap = attnviz.capture(model, cat)
    with torch.inference_mode():  # e.g. called from code that runs under inference mode
        grid = relevance_map(model, cap, 3)
    x = cap.input.clone().requires_grad_(True)
    logits, attentions = attention_forward(model.network, x)
    expected = loop_relevance([a.detach() for a in attentions], torch.autograd.grad(logits[0, 3], attentions))
    np.testing.assert_allclose(grid, expected[0, 3:].reshape(4, 4), rtol=1e-5, atol=1e-7)


def test_models_without_classifier_head_are_refused(cat):
    from conftest import tiny_vit

    model = tiny_vit(num_classes=0)
    cap = attnviz.capture(model, cat)
    with pytest.raises(RelevanceError, match="no classifier head"):
        relevance_map(model, cap, 0)
