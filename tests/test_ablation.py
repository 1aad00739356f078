"""Head ablation (attnviz/ablation.py) against an independent recomputation.

The reference switches a head off in a copy of the network with a forward pre-hook on that layer's
attention projection, which zeroes the head's slice of the projection's input, then runs the copy's
own forward (timm's Attention, fused path) on the whole photo: no reuse of earlier layers, no code
from attnviz. Every effect must agree within 1e-4.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import attnviz
from attnviz import ablation
from attnviz.errors import FaithfulnessError

from conftest import Overlap, tiny_vit


def reference_output(network, x, off):
    twin = copy.deepcopy(network)
    d = twin.blocks[0].attn.head_dim
    for layer, head in off:
        def zero(_module, args, head=head):
            y = args[0].clone()
            y[..., head * d:(head + 1) * d] = 0.0
            return (y,)
        twin.blocks[layer].attn.proj.register_forward_pre_hook(zero)
    with torch.no_grad():
        return twin(x)[0].double()


def reference_grid(model, cap):
    base = reference_output(model.network, cap.input, [])
    grid = np.zeros((model.depth, model.num_heads))
    for layer in range(model.depth):
        for head in range(model.num_heads):
            out = reference_output(model.network, cap.input, [(layer, head)])
            if model.labels is None:
                grid[layer, head] = 1 - float(torch.nn.functional.cosine_similarity(out, base, dim=0))
            else:
                target = int(base.argmax())
                grid[layer, head] = float(base.softmax(0)[target] - out.softmax(0)[target])
    return grid


def capture_of(model, seed=0):
    return attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("classes", [10, 0])
def test_every_effect_equals_the_reference(classes):
    model = tiny_vit(num_classes=classes, seed=2)
    cap = capture_of(model)
    result = ablation.head_ablation(model, cap)
    assert result.measure == ("probability" if classes else "cosine")
    assert result.effect.shape == (2, 4)
    assert np.abs(result.effect - reference_grid(model, cap)).max() <= 1e-4
    assert np.abs(result.effect).max() > 1e-3  # the heads matter at all: a zero grid would pass trivially


def test_each_layers_runs_are_split_across_the_cores_one_thread_each(monkeypatch):
    """A server tuned to one PyTorch thread per forward pass still uses every core for the grid; the effects
    are the reference's, and the caller's thread count is as it was."""
    from attnviz import interventions

    monkeypatch.setattr(interventions, "core_count", lambda: 2)
    model = tiny_vit(num_classes=10, seed=2)
    cap = capture_of(model)
    probe = Overlap(interventions.block_forward, hold_s=0.05)
    monkeypatch.setattr(interventions, "block_forward", probe)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        result = ablation.head_ablation(model, cap)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    ablated = [call for call in probe.calls if call[0].startswith("attnviz-ablation")]
    assert probe.most == 2 and {threads for _, threads, _ in ablated} == {1}  # two halves at once, one thread each
    assert sorted(rows for _, _, rows in ablated) == [2, 2, 4, 4]  # layer 1: 4 runs, layer 2: 4 carried + 4 new
    assert np.abs(result.effect - reference_grid(model, cap)).max() <= 1e-4


def test_statistics_and_their_rank_correlation():
    model = tiny_vit(seed=3)
    cap = capture_of(model)
    result = ablation.head_ablation(model, cap)
    p = cap.num_prefix_tokens
    row = cap.layer_rows(1, 0)[2, p:].double().numpy()
    row = row / row.sum()
    assert result.entropy[1, 2] == pytest.approx(-(row * np.log(row)).sum(), abs=1e-9)  # nats, as the stats view
    top = np.argsort(-attnviz.rollout_map(cap).ravel(), kind="stable")[:2]  # 10 % of 16 patches, rounded
    assert result.top_share[1, 2] == pytest.approx(row[top].sum(), abs=1e-9)
    assert ablation.spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert ablation.spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1.0)
    assert ablation.spearman(np.array([1, 2, 2, 3]), np.array([1, 2, 3, 4])) == pytest.approx(0.9486832980505138)
    assert result.entropy_correlation == pytest.approx(ablation.spearman(result.effect, result.entropy))


def test_the_sentence_s_tendency_follows_the_sign_and_size_of_rho():
    """Narrow heads (low entropy) or heads on the object (high share) matter "more" or "less" only from
    |ρ| ≥ 0.3; a constant side says nothing."""
    effect = np.arange(12.0).reshape(3, 4)
    def grid(entropy, share):
        return ablation.HeadAblation("cosine", effect, np.asarray(entropy, float).reshape(3, 4),
                                     np.asarray(share, float).reshape(3, 4))
    rising, falling = np.arange(12.0), -np.arange(12.0)
    assert grid(falling, rising).tendency("entropy") == "more"  # the lower the entropy, the larger the effect
    assert grid(falling, rising).tendency("share") == "more"
    assert grid(rising, falling).tendency("entropy") == "less"
    assert grid(rising, falling).tendency("share") == "less"
    weak = np.array([5, 0, 9, 2, 11, 7, 3, 10, 1, 8, 4, 6.0])  # ρ = +0.10 against the effect's order
    assert abs(ablation.spearman(effect, weak)) < ablation.TENDENCY_RHO
    assert grid(weak, -weak).tendency("entropy") == grid(weak, -weak).tendency("share") == "little"
    assert grid(np.ones(12), rising).tendency("entropy") == "none"


def test_several_heads_off_at_once_redraws_every_map():
    model = tiny_vit(seed=4)
    with torch.no_grad():
        for block in model.network.blocks:
            block.attn.qkv.weight[:64] *= 4.0  # peaked attention, as in a trained model
    cap = capture_of(model)
    off = [(0, 1), (0, 3), (1, 0)]
    ablated = ablation.ablated_capture(model, cap, off)
    reference = reference_output(model.network, cap.input, off)
    assert torch.allclose(ablated.output.double(), reference, atol=1e-5)
    # Layer 1's attention is unchanged (nothing before it was switched off); layer 2's is not.
    assert np.abs(ablated.cls_map(0, "mean") - cap.cls_map(0, "mean")).max() < 1e-6
    assert np.abs(ablated.cls_map(1, "mean") - cap.cls_map(1, "mean")).max() > 1e-3
    # Layer 2's weights are those of the copy with layer 1's heads off, read eagerly.
    twin = copy.deepcopy(model.network)
    d = twin.blocks[0].attn.head_dim
    twin.blocks[0].attn.proj.register_forward_pre_hook(
        lambda _m, a: (a[0] * torch.tensor([0.0 if h in (1, 3) else 1.0 for h in range(4)]).repeat_interleave(d),))
    seen = []
    twin.blocks[1].attn.fused_attn = False
    twin.blocks[1].attn.attn_drop.register_forward_hook(lambda _m, a, _o: seen.append(a[0][0]))
    with torch.no_grad():
        twin(cap.input)
    assert torch.allclose(ablated.layer_weights(1), seen[0], atol=1e-5)
    with pytest.raises(IndexError):
        ablation.ablated_capture(model, cap, [(2, 0)])


def test_a_rope_models_heads_are_switched_off_at_their_output_projection():
    """Not a plain ViT's blocks: each head off is its slice of the output projection's input zeroed (the hook), which
    must equal the network with that head's columns of the projection's weight set to zero (an independent copy)."""
    import copy

    import timm

    torch.manual_seed(0)
    network = timm.create_model("vit_small_patch16_rope_224", pretrained=False, num_classes=3, img_size=32,
                                depth=2, embed_dim=32, num_heads=2).eval()
    with torch.no_grad():
        network.head.weight.normal_(0, 1.0)  # timm starts the classifier near zero: every class at 1/3
        for block in network.blocks:  # and each head's share of the residual stream small
            block.attn.proj.weight.normal_(0, 1.0)
    model = attnviz.wrap(network, "rope", "random init", 32)
    cap = attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    result = ablation.head_ablation(model, cap)
    assert result.effect.shape == (2, 2) and result.measure == "probability"
    with torch.no_grad():
        base = network(cap.input)[0].softmax(-1)
        target = int(base.argmax())
        for layer in range(2):
            for head in range(2):
                twin = copy.deepcopy(network)
                twin.blocks[layer].attn.proj.weight[:, head * 16:(head + 1) * 16] = 0.0  # head_dim 16
                expected = float(base[target] - twin(cap.input)[0].softmax(-1)[target])
                assert result.effect[layer, head] == pytest.approx(expected, abs=1e-6)
                ablated = ablation.ablated_capture(model, cap, [(layer, head)])
                assert torch.allclose(ablated.output, twin(cap.input)[0], atol=1e-6)
    assert np.abs(result.effect).max() > 1e-4  # switching a head off changes the answer


def test_heads_switched_off_on_one_thread_leave_another_threads_pass_alone():
    """The switch is per thread (the Tap's threading.local): a shared model's other sessions see every head on."""
    import threading

    model = tiny_vit()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = model.network(x)
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(5)
        with torch.no_grad():
            seen["other"] = model.network(x)
        done.set()

    worker = threading.Thread(target=other)
    worker.start()
    with model.tap.heads_off({0: (0, 1, 2, 3)}):
        inside.set()
        done.wait(5)
        with torch.no_grad():
            seen["mine"] = model.network(x)
    worker.join(5)
    assert torch.equal(seen["other"], plain) and not torch.allclose(seen["mine"], plain)


def _first(module, kind):
    return next(m for m in module.modules() if isinstance(m, kind))


@pytest.mark.parametrize("name, size, conv", [("levit_128s", 112, False), ("levit_conv_128s", 112, True),
                                              ("visformer_tiny", 64, True)])
def test_heads_meeting_behind_an_activation_or_in_a_conv_are_switched_off_there(name, size, conv):
    """LeViT's heads enter Hardswish, then a Linear (or, as convolutions, a 1 × 1 conv) with batch norm; Visformer's a
    1 × 1 conv. Each head off must equal an independent copy whose projection weight has that head's input columns
    set to zero (Hardswish(0) = 0): the same network with the head's output removed."""
    import timm

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, num_classes=3, img_size=size).eval()
    with torch.no_grad():  # timm starts each projection's batch norm at zero and the classifiers near it: no head mattered
        for module in network.modules():
            if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                module.weight.normal_(1.0, 0.5)
        for head in {network.head, getattr(network, "head_dist", network.head)}:  # LeViT's NormLinear, Visformer's Linear
            getattr(head, "linear", head).weight.normal_(0, 1.0)
    model = attnviz.wrap(network, name, "random init", size)
    cap = attnviz.capture_tensor(model, torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)))
    assert ablation.switch_refusal(model) is None and len(model.tap.switched) == model.depth
    layers = sorted({0, model.depth // 2, model.depth - 1})
    with torch.no_grad():
        for layer in layers:
            heads = cap.heads(layer)
            for head in (0, heads - 1):
                twin = copy.deepcopy(network)
                path = next(p for p, m in network.named_modules() if m is model.adapter.attentions[layer])
                linear = _first(twin.get_submodule(path).proj, torch.nn.Conv2d if conv else torch.nn.Linear)
                d = linear.weight.shape[1] // heads
                linear.weight[:, head * d:(head + 1) * d] = 0.0
                expected = twin(cap.input)[0]
                ablated = ablation.ablated_capture(model, cap, [(layer, head)]).output
                change = (expected - cap.output).abs().max()  # what switching the head off did
                assert change > 1e-2 * cap.output.abs().max()  # it mattered
                assert (ablated - expected).abs().max() < 1e-3 * change, (layer, head)


def test_a_family_whose_heads_meet_in_no_projection_of_their_own_is_refused_in_one_sentence():
    import timm

    # SHViT: one head on part of the channels, the rest passed by; its projection's input is not the heads' outputs
    network = timm.create_model("shvit_s1", pretrained=False, num_classes=3).eval()
    model = attnviz.wrap(network, "shvit", "random init", 224)
    cap = attnviz.capture_tensor(model, torch.randn(1, 3, 224, 224))
    with pytest.raises(FaithfulnessError, match=r"^shvit \(timm SHViT\) does not pass each head's output into one "
                                                 r"projection, side by side with the other heads' and nowhere else, at every "
                                                 r"layer, so attnviz cannot switch one head off there\.$"):
        ablation.head_ablation(model, cap)


def test_real_model_grid_equals_the_reference_on_some_heads(real_model):
    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample("cat"), real_model).image)
    result = ablation.head_ablation(real_model, cap)
    assert result.effect.shape == (12, 6) and result.measure == "cosine"
    base = reference_output(real_model.network, cap.input, [])
    for layer, head in [(0, 0), (5, 3), (11, 5), tuple(np.unravel_index(result.effect.argmax(), (12, 6)))]:
        out = reference_output(real_model.network, cap.input, [(int(layer), int(head))])
        expected = 1 - float(torch.nn.functional.cosine_similarity(out, base, dim=0))
        assert result.effect[layer, head] == pytest.approx(expected, abs=1e-4)
