"""Deletion / insertion curves (attnviz/faithfulness.py) against an independent recomputation.

The reference below is written from the definitions, not from the code under test: it removes the
patches itself (pixels pasted over with a plain loop, or the patch tokens dropped from a sequence it
builds from the patch projection and the position table), runs timm's own blocks one after the other,
and reads the output itself. Every curve value must agree within 1e-4.
"""
from __future__ import annotations


import numpy as np
import pytest
import timm
import torch

import attnviz
from attnviz import faithfulness as fa
from attnviz import interventions
from attnviz.errors import FaithfulnessError
from attnviz.lesson import fill_image

from conftest import Overlap, tiny_vit


def reference_tokens(network, x: torch.Tensor, removed: set[int]) -> torch.Tensor:
    """Output with the patch tokens in ``removed`` dropped: CLS (+ its position) then the kept patches
    (+ their own positions), timm's blocks one by one, the final norm, the CLS token, the head."""
    patches = network.patch_embed.proj(x).flatten(2).transpose(1, 2)  # (1, P, D)
    pos = network.pos_embed  # (1, 1 + P, D): the class token's position first
    cls = network.cls_token + pos[:, :1]
    kept = [p for p in range(patches.shape[1]) if p not in removed]
    seq = torch.cat([cls, patches[:, kept] + pos[:, 1:][:, kept]], dim=1)
    for block in network.blocks:
        seq = block(seq)
    return network.head(network.fc_norm(network.norm(seq)[:, 0]))[0]  # (C,)


def reference_pixels(network, x: torch.Tensor, removed: set[int], filled: torch.Tensor, patch: int, w: int):
    y = x.clone()
    for p in removed:
        r, c = divmod(p, w)
        y[:, :, r * patch:(r + 1) * patch, c * patch:(c + 1) * patch] = filled[:, :, r * patch:(r + 1) * patch,
                                                                               c * patch:(c + 1) * patch]
    return network(y)[0]


def reference_curves(model, cap, order, fill, steps=10):
    network, (h, w), patch = model.network, cap.grid, model.patch
    x, num = cap.input, h * w
    filled = fill_image(x, fill, patch) if fill != "token" else None

    def out(removed):
        with torch.no_grad():
            if fill == "token":
                return reference_tokens(network, x, removed).double()
            return reference_pixels(network, x, removed, filled, patch, w).double()

    base = out(set())
    if model.labels is None:
        measure = lambda o: float(torch.nn.functional.cosine_similarity(o, base, dim=0))  # noqa: E731
    else:
        target = int(base.argmax())
        measure = lambda o: float(o.softmax(0)[target])  # noqa: E731
    counts = [num * i // steps for i in range(steps + 1)]
    deletion = [measure(out(set(order[:n].tolist()))) for n in counts]
    insertion = [measure(out(set(order[n:].tolist()))) for n in counts]
    return np.array(counts), np.array(deletion), np.array(insertion)


@pytest.fixture(scope="module")
def tiny_classifier():
    model = tiny_vit()
    with torch.no_grad():
        for block in model.network.blocks:
            block.attn.qkv.weight[:64] *= 4.0  # peaked attention, as in a trained model
    return model


@pytest.fixture(scope="module")
def tiny_backbone():
    return tiny_vit(num_classes=0, seed=1)


def capture_of(model, seed=0):
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return attnviz.capture_tensor(model, x)


@pytest.mark.parametrize("fill", fa.FILLS)
@pytest.mark.parametrize("which", ["classifier", "backbone"])
def test_every_curve_value_equals_the_reference(which, fill, tiny_classifier, tiny_backbone):
    model = tiny_classifier if which == "classifier" else tiny_backbone
    cap = capture_of(model)
    result = fa.faithfulness(model, cap, fill=fill)
    assert result.measure == ("probability" if which == "classifier" else "cosine")
    names = [c.name for c in result.curves]
    assert names[:2] == ["attention, layer 1, mean of heads", "attention, layer 2, mean of heads"]
    assert "attention rollout" in names and "token norm after layer 2" in names
    assert (which == "classifier") == any(n.startswith("class-specific relevance") for n in names)
    assert len(result.random) == 5
    assert result.removed.tolist() == [0, 1, 3, 4, 6, 8, 9, 11, 12, 14, 16]
    worst = 0.0
    curves = (*result.curves, *result.random)
    if (which, fill) not in (("classifier", "token"), ("backbone", "mean")):  # all maps in two cases, a spread here
        curves = curves[::4]
    for curve in curves:
        counts, deletion, insertion = reference_curves(model, cap, curve.ranking.order, fill)
        assert result.removed.tolist() == counts.tolist()
        worst = max(worst, np.abs(curve.deletion - deletion).max(), np.abs(curve.insertion - insertion).max())
        assert curve.deletion_area == pytest.approx(np.trapezoid(deletion, dx=0.1), abs=1e-4)
        assert curve.insertion_area == pytest.approx(np.trapezoid(insertion, dx=0.1), abs=1e-4)
    assert worst <= 1e-4
    # The untouched photo is the start of deletion and the end of insertion.
    if which == "backbone":
        assert result.curves[0].deletion[0] == pytest.approx(1.0, abs=1e-6)
    else:
        assert result.base_probability == pytest.approx(float(cap.output.softmax(-1).max()), abs=1e-5)


def test_orders_follow_the_maps(tiny_classifier):
    cap = capture_of(tiny_classifier)
    result = fa.faithfulness(tiny_classifier, cap, fill="mean", heads=True)
    last = result.curve("attention, layer 2, head 3")
    grid = cap.cls_map(1, 2).ravel()
    assert grid[last.ranking.order].tolist() == sorted(grid.tolist(), reverse=True)
    rolled = attnviz.rollout_map(cap).ravel()
    assert rolled[result.curve("attention rollout").ranking.order[0]] == rolled.max()
    # Random orders are permutations, different from each other, and the same for the same seed.
    orders = [c.ranking.order for c in result.random]
    assert all(sorted(o.tolist()) == list(range(16)) for o in orders)
    assert len({tuple(o) for o in orders}) == 5
    again = fa.faithfulness(tiny_classifier, cap, fill="mean")
    assert [c.ranking.order.tolist() for c in again.random] == [o.tolist() for o in orders]


def synthetic(deletions: dict[str, float], random: list[float]) -> fa.Faithfulness:
    """A result whose curves are flat at the given values, so each area is that value."""
    def curve(name, kind, value, layer=None, head=None):
        ranking = fa.Ranking(name, kind, np.arange(4), layer, head)
        return fa.Curve(ranking, np.full(11, value), np.full(11, 1 - value))

    curves = []
    for name, value in deletions.items():
        if name == "rollout":
            curves.append(curve("attention rollout", "rollout", value))
        else:
            layer = int(name)
            curves.append(curve(f"attention, layer {layer + 1}, mean of heads", "attention", value, layer, "mean"))
    randoms = [curve(f"random order {i + 1}", "random", v) for i, v in enumerate(random)]
    return fa.Faithfulness("token", "cosine", np.arange(11), 4, tuple(curves), tuple(randoms))


def test_the_sentence_follows_the_numbers():
    # Random orders: mean 0.52, sample standard deviation 0.0316.
    result = synthetic({"rollout": 0.31, "11": 0.50, "3": 0.70}, [0.48, 0.50, 0.52, 0.54, 0.56])
    mean, spread = result.random_deletion
    assert (mean, round(spread, 4)) == (pytest.approx(0.52), 0.0316)
    text = fa.sentence(result)
    assert text == ("On this photo (token removal; cosine similarity to the untouched photo's features), the deletion "
                    "area is 0.31 for “attention rollout”, 0.50 for “attention, layer 12, mean of heads” and "
                    "0.52 ± 0.03 for 5 random orders: “attention rollout” points at what the model relies on; "
                    "“attention, layer 12, mean of heads” is no better than random.")
    assert [result.verdict(c) for c in result.curves] == ["better", "random", "worse"]
    rows = fa.table(result)
    assert [r["map"] for r in rows[:3]] == ["attention rollout", "attention, layer 12, mean of heads",
                                            "attention, layer 4, mean of heads"]
    assert rows[-1]["deletion_area"] == pytest.approx(0.52)
    zh = fa.sentence(result, "zh-TW")
    assert "0.31" in zh and "0.52 ± 0.03" in zh and "並不比隨機好" in zh
    # When the last layer's map is itself the best, it is compared with the worst.
    flipped = synthetic({"rollout": 0.60, "11": 0.20}, [0.48, 0.50, 0.52, 0.54, 0.56])
    assert "the deletion area is 0.20 for “attention, layer 12, mean of heads”, 0.60 for “attention rollout”" in \
        fa.sentence(flipped)
    assert "“attention rollout” does worse than random" in fa.sentence(flipped)


def test_token_removal_is_refused_where_positions_tie_logits_and_pixel_fills_work():
    torch.manual_seed(0)
    network = timm.create_model("vit_small_patch16_rope_224", pretrained=False, num_classes=3, img_size=32,
                                depth=1, embed_dim=32, num_heads=2).eval()
    model = attnviz.wrap(network, "rope", "random init", 32)
    cap = attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32))
    with pytest.raises(FaithfulnessError, match="not available"):
        fa.faithfulness(model, cap, fill="token")
    result = fa.faithfulness(model, cap, fill="blur", random_orders=2)
    assert len(result.curves) >= 3 and np.isfinite(result.curves[0].deletion).all()


def test_token_removal_needs_an_output_token():
    torch.manual_seed(0)
    network = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=0, class_token=False,
        global_pool="avg")
    model = attnviz.wrap(network, "no cls", "random init", 32)
    cap = attnviz.capture_tensor(model, torch.randn(1, 3, 32, 32))
    with pytest.raises(FaithfulnessError, match="averages its patch tokens"):
        fa.faithfulness(model, cap, fill="token")
    result = fa.faithfulness(model, cap, fill="mean", random_orders=2)
    assert result.curves[0].name == "mean attention received, layer 1, mean of heads"
    counts, deletion, insertion = reference_curves(model, cap, result.curves[0].ranking.order, "mean")
    assert np.abs(result.curves[0].deletion - deletion).max() <= 1e-4


def test_progress_reaches_one_and_can_stop_the_run(tiny_classifier):
    cap = capture_of(tiny_classifier)
    seen = []
    fa.faithfulness(tiny_classifier, cap, fill="token", progress=seen.append, batch=8)
    assert seen[-1] == pytest.approx(1.0) and seen == sorted(seen) and len(seen) > 3

    class Stop(Exception):
        pass

    def stop(fraction):
        raise Stop

    with pytest.raises(Stop):
        fa.faithfulness(tiny_classifier, cap, fill="mean", progress=stop)


@pytest.mark.parametrize("fill", ["token", "mean"])
def test_removal_on_pytorch_runs_one_thread_per_core_and_leaves_the_callers_threads(fill, tiny_classifier,
                                                                                     monkeypatch):
    """Batches run side by side, one PyTorch thread each (a server tuned to one thread would otherwise use one
    core); the caller's thread count, and what later threads inherit, are as they were."""
    import threading

    monkeypatch.setattr(interventions, "core_count", lambda: 2)
    cap = capture_of(tiny_classifier)
    if fill == "token":  # the shortened sequences through the blocks
        probe = Overlap(interventions.run_blocks)
        monkeypatch.setattr(interventions, "run_blocks", probe)
    else:  # whole filled photos through the network
        probe = Overlap(tiny_classifier.adapter.forward_batch)
        monkeypatch.setattr(tiny_classifier.adapter, "forward_batch", probe)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        alone = fa.faithfulness(tiny_classifier, cap, fill=fill, batch=4)
        later = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert torch.get_num_threads() == 3 and later == [3]
    finally:
        torch.set_num_threads(before)
    assert {threads for _, threads, _ in probe.calls} == {1}
    assert probe.most == 2 and all(name.startswith("attnviz-removal") for name, _, _ in probe.calls)  # two at once
    counts, deletion, _ = reference_curves(tiny_classifier, cap, alone.curves[0].ranking.order, fill)
    assert np.abs(alone.curves[0].deletion - deletion).max() <= 1e-4


def test_real_model_curves_equal_the_reference(real_model, cat):
    """The offline ViT-S/14 at 196 px, token removal: every value of the rollout's curves."""
    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample("cat"), real_model).image)
    rankings, _ = fa.standard_rankings(real_model, cap, random_orders=0)
    chosen = [r for r in rankings if r.kind == "rollout"]
    result = fa.faithfulness(real_model, cap, chosen, fill="token")
    assert result.measure == "cosine"
    for curve in (*result.curves, *result.random):
        counts, deletion, insertion = reference_curves(real_model, cap, curve.ranking.order, "token")
        assert np.abs(curve.deletion - deletion).max() <= 1e-4
        assert np.abs(curve.insertion - insertion).max() <= 1e-4
    assert result.removed.tolist() == [0, 19, 39, 58, 78, 98, 117, 137, 156, 176, 196]


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_token_removal_on_a_runtime_equals_the_reference(runtime, tiny_classifier, tmp_path, monkeypatch):
    """attnviz.fast adds the blocks-and-head graph (any batch, any length), exported and checked exact on first
    use; every curve value computed on it agrees with the plain loop over timm's blocks — with one thread per
    call, three batches run at once (as on a 3-core server), each result in its own rows."""
    pytest.importorskip(runtime)
    monkeypatch.setattr(interventions, "core_count", lambda: 3)
    model = attnviz.fast(tiny_classifier, runtime, cache=tmp_path)
    assert model.runtime is not None and model.runtime.blocks is not None
    assert not list(tmp_path.glob("blocks-*.onnx"))  # a server that never draws the curves never pays for them
    cap = capture_of(model, seed=3)
    result = fa.faithfulness(model, cap, fill="token")
    assert list(tmp_path.glob("blocks-*.onnx"))
    calls = []
    plain = type(model.runtime).blocks_output

    def counted(self, tokens):
        calls.append(tuple(tokens.shape))
        return plain(self, tokens)

    type(model.runtime).blocks_output = counted
    try:
        again = fa.faithfulness(model, cap, fill="token")
    finally:
        type(model.runtime).blocks_output = plain
    assert calls and all(shape[2] == 32 for shape in calls)  # the runs went through the runtime
    for curve in (*result.curves[::3], *result.random[:2]):
        counts, deletion, insertion = reference_curves(tiny_classifier, cap, curve.ranking.order, "token")
        assert np.abs(curve.deletion - deletion).max() <= 1e-4
        assert np.abs(curve.insertion - insertion).max() <= 1e-4
    for a, b in zip(result.curves, again.curves):
        np.testing.assert_array_equal(a.deletion, b.deletion)


def test_a_server_on_auto_captures_on_onnx_runtime_and_removes_tokens_on_openvino(tiny_classifier, tmp_path, caplog):
    """ATTNVIZ_RUNTIME=auto: captures on ONNX Runtime (the lighter in memory), token removal's and the live camera's
    graphs on OpenVINO (the faster at them), each started on first use — and the curves exact either way."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    from attnviz import runtimes

    with caplog.at_level("INFO", logger="attnviz.runtimes"):
        model = runtimes.on_runtime(tiny_classifier, "auto", cache=tmp_path)
    assert model.runtime.name == "onnxruntime" and model.runtime.blocks.runtime == model.runtime.rows.runtime == "openvino"
    assert any("token removal on openvino and live frames on openvino, each checked on first use" in r.getMessage()
               for r in caplog.records)
    cap = capture_of(model, seed=4)
    result = fa.faithfulness(model, cap, fill="token", random_orders=1)
    assert model.runtime.removal() is not None
    for curve in result.curves[::4]:
        counts, deletion, insertion = reference_curves(tiny_classifier, cap, curve.ranking.order, "token")
        assert np.abs(curve.deletion - deletion).max() <= 1e-4
        assert np.abs(curve.insertion - insertion).max() <= 1e-4


def test_a_cancelled_run_on_a_runtime_starts_no_more_batches(tiny_classifier, tmp_path, monkeypatch):
    """The page's Cancel raises from ``progress``: batches already running finish, no other starts."""
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(interventions, "core_count", lambda: 2)
    model = attnviz.fast(tiny_classifier, "onnxruntime", cache=tmp_path, threads=1)
    cap = capture_of(model, seed=3)
    calls = []
    plain = type(model.runtime).blocks_output

    def counted(self, tokens):
        calls.append(tokens.shape[1])
        return plain(self, tokens)

    class Stop(Exception):
        pass

    def stop(fraction):
        raise Stop

    monkeypatch.setattr(type(model.runtime), "blocks_output", counted)
    with pytest.raises(Stop):
        fa.faithfulness(model, cap, fill="token", progress=stop, batch=4)
    cancelled = len(calls)
    fa.faithfulness(model, cap, fill="token", batch=4)
    whole = len(calls) - cancelled
    assert whole >= 20 and 1 <= cancelled <= 3  # the first batch, the one beside it, the one sent after the first


def test_a_blocks_graph_that_is_not_exact_leaves_token_removal_on_pytorch(tiny_classifier, tmp_path, monkeypatch, caplog):
    pytest.importorskip("onnxruntime")
    from attnviz import runtimes

    monkeypatch.setattr(runtimes, "blocks_mismatch", lambda model, run: "it is off by 1.0e+00")
    with caplog.at_level("WARNING", logger="attnviz.runtimes"):
        model = attnviz.fast(tiny_classifier, "onnxruntime", cache=tmp_path)
        cap = capture_of(model, seed=3)
        result = fa.faithfulness(model, cap, fill="token", random_orders=1)
        fa.faithfulness(model, cap, fill="token", random_orders=1)
    assert model.runtime is not None and model.runtime.removal() is None  # captures still run on the runtime
    assert [r.getMessage() for r in caplog.records] == ["tiny removes tokens on PyTorch: on onnxruntime it is off by 1.0e+00"]
    counts, deletion, insertion = reference_curves(tiny_classifier, cap, result.curves[0].ranking.order, "token")
    assert np.abs(result.curves[0].deletion - deletion).max() <= 1e-4  # on PyTorch, still exact


def test_the_last_block_for_the_class_token_alone_equals_the_whole_block(tiny_classifier):
    """block_forward(first=1): the class token's output of the last block, exactly the full block's row 0."""
    from attnviz import interventions

    network = tiny_classifier.network
    x = interventions.embed(network, torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(5)))
    with torch.no_grad():
        full = network.blocks[-1](x)  # timm's own block
        first = interventions.block_forward(network.blocks[-1], x, first=1)
    assert first.shape == (3, 1, 32)
    torch.testing.assert_close(first[:, 0], full[:, 0], rtol=0, atol=1e-6)
    assert interventions.reads_class_token(network)


def rope_classifier():
    torch.manual_seed(0)
    network = timm.create_model("vit_small_patch16_rope_224", pretrained=False, num_classes=3, img_size=32,
                                depth=1, embed_dim=32, num_heads=2).eval()
    return attnviz.wrap(network, "rope", "random init", 32)


@pytest.mark.parametrize("heads", [False, True])
def test_the_page_counts_the_maps_and_passes_before_computing_them(heads, tiny_classifier, tiny_backbone):
    """What the page says before its button is pressed: as many maps as standard_rankings gives (a classifier's
    relevance map where its family has the eager forward, none where it refuses), and the passes they take."""
    seen = set()
    for model in (tiny_classifier, tiny_backbone, rope_classifier()):
        cap = capture_of(model)
        rankings, notes = fa.standard_rankings(model, cap, heads=heads)
        assert fa.map_count(model, cap, heads=heads) == len(rankings)
        seen.add(("relevance" in {r.kind for r in rankings}, bool(notes)))
        result = fa.faithfulness(model, cap, heads=heads, fill="mean")
        assert result.inputs <= fa.planned_inputs(len(rankings)) == 2 + 18 * len(rankings)
    assert seen == {(True, False), (False, False), (False, True)}  # with relevance, without, and refused


def test_the_real_models_page_caption_is_its_run(real_model, cat, monkeypatch):
    """19 maps (12 layers, rollout, token norms, 5 random orders) and 344 forward passes: the numbers the button
    caption gives are the run's own. The run's rankings are computed; its 344 inputs are counted as they are handed
    to the forward pass, which is left out (the curves' values are checked against the reference above)."""
    cap = attnviz.capture(real_model, attnviz.load_photo(attnviz.photos.sample("cat"), real_model).image)
    maps = fa.map_count(real_model, cap)
    assert (maps, fa.planned_inputs(maps)) == (19, 344)
    handed = []

    def counted(model, x, removed, fill, *args, **kwargs):
        handed.append(removed.shape[0])
        return torch.rand(removed.shape[0], cap.output.shape[-1], generator=torch.Generator().manual_seed(0))

    monkeypatch.setattr(fa, "outputs", counted)
    result = fa.faithfulness(real_model, cap, fill="token")
    assert (len(result.curves) + len(result.random), result.inputs, handed) == (19, 344, [344])
