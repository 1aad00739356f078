"""Every timm attention family attnviz accepts gives timm's own eager softmax, peaked weights included.

Each model is built small and random (pretrained=False, 2 layers, 64 px), then its q and k weights
are scaled ×6 so that attention is peaked as in a trained model (issue #13: the old capture was off by
up to 1.0 there). The reference is timm's eager path (fused_attn=False), whose softmax output is read
where it enters ``attn_drop``; the capture runs on the unchanged model's fused (SDPA) path.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import timm
import torch

from timm.models.vision_transformer import VisionTransformer

import attnviz
from attnviz import ModelError
from attnviz.adapters import Family, register, registry
from attnviz.adapters.timm_vit import TimmAdapter, layout
from attnviz.capture import capture_tensor
from conftest import Q, K, SCALE, BIAS

FAMILIES = {
    # name: (timm model, extra kwargs)
    "vit": ("vit_small_patch16_224", {}),
    "eva02": ("eva02_tiny_patch14_224", {"img_size": 56}),
    "dinov3": ("vit_small_patch16_dinov3", {}),
    "rope": ("vit_small_patch16_rope_224", {}),
    "rope_mixed": ("vit_small_patch16_rope_mixed_224", {}),
    "relpos": ("vit_relpos_small_patch16_224", {}),
    "srelpos": ("vit_srelpos_small_patch16_224", {}),
    "relpos_cls": ("vit_relpos_medium_patch16_cls_224", {}),
}
PEAK = 6.0


def build(name: str, kwargs: dict, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    kwargs = {"img_size": 64, "depth": 2, **kwargs}
    network = timm.create_model(name, pretrained=False, num_classes=5, **kwargs).eval()
    with torch.no_grad():
        for module in network.modules():
            if hasattr(module, "gamma") and isinstance(module.gamma, torch.nn.Parameter):
                module.gamma.fill_(1.0)  # random init puts LayerScale at ~1e-5: make the blocks count
        for block in network.blocks:
            attn = block.attn
            dim = attn.num_heads * attn.head_dim
            if getattr(attn, "qkv", None) is not None:
                attn.qkv.weight[: 2 * dim] *= PEAK  # q and k rows
            else:
                attn.q_proj.weight *= PEAK
                attn.k_proj.weight *= PEAK
    return network.to(dtype)


def eager_weights(network: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """timm's own eager softmax, (H, N, N) per layer, from a private copy with fused_attn=False."""
    twin = copy.deepcopy(network)
    seen = []
    for block in twin.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda _m, inputs, _o: seen.append(inputs[0][0].detach()))
    with torch.no_grad():
        twin(x)
    assert len(seen) == len(twin.blocks)
    return seen


def worst(cap, reference) -> float:
    return max(float((cap.layer_weights(i).double() - ref.double()).abs().max()) for i, ref in enumerate(reference))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_timm_eager_softmax_when_peaked(family):
    name, kwargs = FAMILIES[family]
    network = build(name, kwargs)
    size = network.patch_embed.img_size[0]
    model = attnviz.wrap(network, name, "random init", size)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    cap = capture_tensor(model, x)
    reference = eager_weights(network, x)
    assert cap.num_layers == 2 and cap.num_tokens == reference[0].shape[-1]
    assert worst(cap, reference) <= 1e-5
    # peaked for real: some head puts over half its weight on one key
    assert max(float(r.max()) for r in reference) > 0.5
    # and the model's own output is untouched by the capture
    with torch.no_grad():
        assert torch.equal(cap.output, network(x)[0])


@pytest.mark.parametrize("family", ["eva02", "dinov3", "rope", "relpos"])
def test_family_exact_in_float64_and_the_old_reading_was_wrong(family):
    """In float64 the capture equals timm's eager softmax to ~1e-12; q·k read at the norms alone
    (no RoPE, no bias: what attnviz did before) is far off, so the test can tell the difference."""
    name, kwargs = FAMILIES[family]
    network = build(name, kwargs, torch.float64)
    size = network.patch_embed.img_size[0]
    model = attnviz.wrap(network, name, "random init", size)
    x = torch.randn(1, 3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    cap = capture_tensor(model, x)
    reference = eager_weights(network, x)
    assert worst(cap, reference) <= 1e-10
    # the old reading: softmax of the q_norm / k_norm outputs, no rotation and no bias
    old = []
    hooks = [b.attn.q_norm.register_forward_hook(lambda _m, _i, o: old.append(o[0])) for b in network.blocks]
    hooks += [b.attn.k_norm.register_forward_hook(lambda _m, _i, o: old.append(o[0])) for b in network.blocks]
    with torch.no_grad():
        network(x)
    for h in hooks:
        h.remove()
    q, k = old[0], old[1]  # layer 1 (q_norm runs before k_norm)
    naive = ((q * SCALE(cap)) @ k.transpose(-2, -1)).softmax(-1)
    assert float((naive - reference[0]).abs().max()) > 0.05


def test_relpos_bias_is_shared_by_captures_and_not_counted_as_theirs():
    name, kwargs = FAMILIES["relpos"]
    network = build(name, kwargs)
    model = attnviz.wrap(network, name, "random init", 64)
    a = capture_tensor(model, torch.randn(1, 3, 64, 64))
    b = capture_tensor(model, torch.randn(1, 3, 64, 64))
    assert all(x.data_ptr() == y.data_ptr() for x, y in zip(a.bias, b.bias)) and BIAS(a).shape == (2, 6, 16, 16)
    assert a.nbytes == 2 * Q(a).nelement() * 4 + a.input.nelement() * 4 + a.output.nelement() * 4 + 2 * 16 * 4


def test_rows_with_bias_equal_matrix_rows():
    name, kwargs = FAMILIES["relpos"]
    model = attnviz.wrap(build(name, kwargs), name, "random init", 64)
    cap = capture_tensor(model, torch.randn(1, 3, 64, 64))
    for head in (0, 5, "mean"):
        np.testing.assert_allclose(cap.row(1, head, 7), cap.weights(1, head)[7], atol=1e-7)


def test_dynamic_size_dinov3_at_another_size_is_exact():
    """DINOv3 is built with dynamic_img_size: at 80 px (not its 64) timm recomputes RoPE for a 5 × 5
    grid, and the capture follows it exactly."""
    name, kwargs = FAMILIES["dinov3"]
    network = build(name, kwargs)
    model = attnviz.wrap(network, name, "random init", 80)
    x = torch.randn(1, 3, 80, 80, generator=torch.Generator().manual_seed(3))
    cap = capture_tensor(model, x)
    assert cap.grid == (5, 5) and cap.num_tokens == 5 + 25  # class token + 4 registers + 25 patches
    assert worst(cap, eager_weights(network, x)) <= 1e-5


# ---- A new family, written and registered in one place ----------------------------------------
# An attention class attnviz does not know (a learned temperature τ_h per head on the logits:
# softmax(τ_h · q · kᵀ · scale)), and everything attnviz needs to read it exactly: the Family below.


class TemperatureAttention(timm.layers.Attention):
    """timm's Attention with a learned per-head temperature on the logits."""

    def __init__(self, dim: int, num_heads: int = 8, **kwargs) -> None:
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.temperature = torch.nn.Parameter(torch.linspace(0.5, 3.0, num_heads))  # (H,)

    def forward(self, x: torch.Tensor, attn_mask=None, is_causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, H, N, d_k)
        q, k = self.q_norm(q), self.k_norm(k)
        tau = self.temperature.view(-1, 1, 1)  # (H, 1, 1)
        if self.fused_attn:
            x = torch.nn.functional.scaled_dot_product_attention(q * tau, k, v)  # SDPA's scale is d_k^-1/2
        else:
            weights = ((q * self.scale) @ k.transpose(-2, -1) * tau).softmax(dim=-1)  # (B, H, N, N)
            x = self.attn_drop(weights) @ v
        return self.proj_drop(self.proj(self.norm(x.transpose(1, 2).reshape(b, n, self.attn_dim))))


class TemperatureAdapter(TimmAdapter):
    """q and k are read at q_norm / k_norm as for timm's ViT; τ_h then goes into q, so that
    softmax(q · kᵀ · scale) is again exactly the module's softmax."""

    def finish(self, recorder) -> None:
        for layer, attn in enumerate(self.attentions):
            recorder.query[layer] *= attn.temperature.view(-1, 1, 1)  # (H, N, d_k) · (H, 1, 1)


TEMPERATURE = Family(
    "temperature", lambda network, size: TemperatureAdapter(family="temperature", **layout(network, size)),
    attention=(TemperatureAttention,),
)


def temperature_vit() -> torch.nn.Module:
    torch.manual_seed(0)
    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5,
                                attn_layer=TemperatureAttention).eval()
    with torch.no_grad():
        for block in network.blocks:
            block.attn.qkv.weight[:64] *= PEAK  # q and k rows: peaked attention
    return network


def test_a_new_family_is_one_registration(monkeypatch):
    network = temperature_vit()
    refusal = (r"^attnviz cannot yet reproduce the attention in test_families\.TemperatureAttention exactly, "
               r"so it refuses VisionTransformer rather than show attention weights that may be wrong\.$")
    with pytest.raises(ModelError, match=refusal):
        attnviz.wrap(network, "temperature", "random init", 32)

    attnviz.adapters.families()  # the built-in families register first, into the real registry
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))  # forgotten after this test
    register(TEMPERATURE)
    model = attnviz.wrap(network, "temperature", "random init", 32)
    assert model.adapter.family == "temperature" and model.network.blocks[0].attn.fused_attn
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    cap = capture_tensor(model, x)  # the model's fused path
    reference = eager_weights(network, x)  # the module's own eager softmax, caught at attn_drop
    assert worst(cap, reference) <= 1e-5
    assert max(float(r.max()) for r in reference) > 0.5  # peaked for real
    # the temperature matters: without it (what a plain timm reading gives) the weights are far off
    q = Q(cap)[1] / network.blocks[1].attn.temperature.view(-1, 1, 1)  # (H, N, d_k) as read at q_norm
    plain = ((q * SCALE(cap)) @ K(cap)[1].transpose(-2, -1)).softmax(-1)
    assert float((plain - reference[1]).abs().max()) > 0.05
    with torch.no_grad():
        assert torch.equal(cap.output, network(x)[0])


def test_a_family_that_loads_says_how_to_count_what_it_loads(monkeypatch):
    """The budget counts every way a model arrives: a family's loader comes with its own count, and a
    family without one is refused by the budget rather than loaded uncounted."""
    from attnviz import serving

    with pytest.raises(ValueError, match="parameters and files describe what its loader loads"):
        Family("counted", lambda network, size: None, recognises=lambda network: False, parameters=lambda s, z: 0)
    attnviz.adapters.families()
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))
    register(Family("uncounted", lambda network, size: None, recognises=lambda network: False,
                    prefix="uncounted:", load=lambda spec, size, device: {}))
    with pytest.raises(ModelError, match=r"^uncounted:x: the uncounted family cannot count its parameters before "
                                         r"loading, so it cannot be checked against a budget\.$"):
        serving.model_parameters("uncounted:x")
    hf = attnviz.adapters.family_of_name("hf:folder")
    assert hf.parameters is not None and hf.files is not None  # Hugging Face counts from config.json
