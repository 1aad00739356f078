"""On a CUDA GPU, everything attnviz computes gives the numbers it gives on the CPU.

Skipped where PyTorch sees no GPU (CI has none). ``make test-gpu`` runs it on a machine that has one;
docs/tests.md#the-gpu says where and when it last ran, and what it found.

The references do not run on the GPU: the zoo walk's eager softmax on the CPU (tests/zoo.py), and for the
experiments the same function on the CPU, whose own tests check it against plain loops and hand-written
forward passes.
"""
from __future__ import annotations

import copy
import gzip
import json
import os
import re

import numpy as np
import pytest
import timm
import torch
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import ablation, cli, html, lesson, live, neuron, qkmap, relevance, rollout, stats
from attnviz_app import views
from attnviz import faithfulness as fa
from conftest import APP, Q, K
from tests.rounding import NUMBER, same_but_rounding
from tests.test_zoo import SMALL_BUILDS
from tests.zoo import TOLERANCE, walk_one

# ATTNVIZ_TEST_GPU=cpu runs these on the CPU against itself: a dry run of the tests' own logic, nothing more.
GPU = os.environ.get("ATTNVIZ_TEST_GPU", "cuda")
pytestmark = pytest.mark.skipif(GPU == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")
# The plain, RoPE and relative-position ViTs beside the zoo's small builds (the offline default is a DINOv2 ViT).
GPU_BUILDS = SMALL_BUILDS + [
    ("vision_transformer", "vit_small_patch14_dinov2", {"depth": 2, "img_size": 98}, 98),
    ("vision_transformer", "vit_small_patch16_224", {"depth": 2, "reg_tokens": 4, "no_embed_class": True}, 224),
    ("eva", "eva02_tiny_patch14_224", {"depth": 2, "img_size": 56}, 56),
    ("eva", "vit_small_patch16_dinov3", {"depth": 2}, 224),
    ("eva", "vit_small_patch16_rope_224", {"depth": 2}, 224),
    ("vision_transformer_relpos", "vit_relpos_small_patch16_224", {"depth": 2}, 224),
]


def close(a, b) -> float:
    """max |a − b| over two arrays or tensors, wherever they live."""
    a = a.detach().double().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, np.float64)
    b = b.detach().double().cpu().numpy() if isinstance(b, torch.Tensor) else np.asarray(b, np.float64)
    assert a.shape == b.shape
    return float(np.abs(a - b).max()) if a.size else 0.0


@pytest.mark.parametrize("module, name, kwargs, size", GPU_BUILDS, ids=[f"{b[1]}-{b[3]}" for b in GPU_BUILDS])
def test_every_family_on_the_gpu_equals_the_eager_softmax(module, name, kwargs, size):
    on_cpu = walk_one(module, name, kwargs, size, float64=True)
    on_gpu = walk_one(module, name, kwargs, size, device=GPU, float64=True)
    assert on_gpu.status == on_cpu.status == "exact", on_gpu.detail
    assert on_cpu.worst64 <= 1e-9  # the float64 reference is the model's arithmetic
    # Against the float64 weights, the GPU's float32 is about as close as the CPU's. Its sums run in another order,
    # so it does not round alike: peaked random logits put either device up to ~8e-5 off, the GPU at most 2.4×
    # the CPU (PiT, LeViT, MaxViT on an H200). TensorFloat-32 convolutions were 100× farther (1e-3 to 4e-3).
    assert on_gpu.truth <= max(TOLERANCE, 3 * on_cpu.truth), (on_gpu, on_cpu)
    # the map the page draws, against the CPU capture's: a mean of weights, so within both devices' errors
    assert on_gpu.summaries <= max(TOLERANCE, on_gpu.truth + on_cpu.truth), on_gpu


# ---- the offline model on the cat photo ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(cat):
    """(CPU model, GPU model, CPU capture, GPU capture) of the offline ViT-S/14 at its default size."""
    cpu, gpu = attnviz.load_model(device="cpu"), attnviz.load_model(device=GPU)
    assert next(gpu.network.parameters()).device.type == torch.device(GPU).type
    return cpu, gpu, attnviz.capture(cpu, cat), attnviz.capture(gpu, cat)


def test_the_capture_on_the_gpu_is_the_cpus(pair):
    _cpu, _gpu, c, g = pair
    assert Q(g).device.type == torch.device(GPU).type
    assert close(g.all_weights(), c.all_weights()) <= 1e-5
    assert close(Q(g), Q(c)) <= 1e-4 * float(Q(c).abs().max())
    assert close(K(g), K(c)) <= 1e-4 * float(K(c).abs().max())
    assert close(g.output, c.output) <= 1e-4 * float(c.output.abs().max())
    assert close(g.token_norms, c.token_norms) <= 1e-4 * float(c.token_norms.max())
    for layer in (0, 11):
        assert close(g.cls_map(layer, "mean"), c.cls_map(layer, "mean")) <= 1e-5
    assert close(rollout.cls_rollout_grid(g), rollout.cls_rollout_grid(c)) <= 1e-5


@pytest.mark.parametrize("size", [518])
def test_the_capture_at_518_px_on_the_gpu_is_the_cpus(cat, size):
    cpu, gpu = attnviz.load_model(size=size, device="cpu"), attnviz.load_model(size=size, device=GPU)
    c, g = attnviz.capture(cpu, cat), attnviz.capture(gpu, cat)
    assert c.num_tokens == 1 + 37 * 37
    assert close(g.all_weights(), c.all_weights()) <= 1e-5


def test_the_neuron_view_on_the_gpu_equals_the_captures_weight(pair):
    g = pair[3]
    for layer, head, query, key in [(0, 0, 0, 5), (5, 3, 17, 100), (11, 5, 0, 0), (11, 2, 150, 60)]:
        p = neuron.neuron_pair(g, layer, head, query, key)
        assert abs(p.weight - float(g.weights(layer, head)[query, key])) <= 1e-6
        assert abs(p.dot - float(Q(g)[layer, head, query].double() @ K(g)[layer, head, key].double())) <= 1e-3


@pytest.mark.parametrize("fill", ["token", "mean", "blur"])
def test_the_curves_on_the_gpu_are_the_cpus(pair, fill):
    cpu, gpu, c, g = pair
    rankings, _ = fa.standard_rankings(cpu, c)  # the same patch orders on both (ties could rank apart)
    on_cpu = fa.faithfulness(cpu, c, rankings, fill=fill)
    on_gpu = fa.faithfulness(gpu, g, rankings, fill=fill)
    assert [x.name for x in on_gpu.curves] == [x.name for x in on_cpu.curves] and len(on_gpu.random) == 5
    for a, b in zip(on_gpu.curves + on_gpu.random, on_cpu.curves + on_cpu.random):
        assert close(a.deletion, b.deletion) <= 1e-4 and close(a.insertion, b.insertion) <= 1e-4, a.name
    assert on_cpu.curves[0].deletion[0] == pytest.approx(1.0, abs=1e-6)  # the untouched photo: cosine 1


def test_the_ablation_grid_on_the_gpu_is_the_cpus(pair):
    cpu, gpu, c, g = pair
    on_cpu, on_gpu = ablation.head_ablation(cpu, c), ablation.head_ablation(gpu, g)
    assert on_gpu.effect.shape == (12, 6)
    assert close(on_gpu.effect, on_cpu.effect) <= 1e-4
    assert float(on_cpu.effect.max()) > 1e-3  # some head matters: the comparison is not of zeros
    for statistic in ("entropy", "share"):  # the page's sentence follows the sign of ρ (HeadAblation.tendency)
        assert on_gpu.tendency(statistic) == on_cpu.tendency(statistic), statistic
    assert abs(on_gpu.share_correlation - on_cpu.share_correlation) <= 1e-3
    off = [(2, 1), (7, 4)]
    a, b = ablation.ablated_capture(gpu, g, off), ablation.ablated_capture(cpu, c, off)
    assert close(a.all_weights(), b.all_weights()) <= 1e-5
    assert close(a.all_weights(), g.all_weights()) > 1e-3  # and switching heads off changed the later layers


def test_the_lessons_removal_test_on_the_gpu_is_the_cpus(pair):
    cpu, gpu, c, g = pair
    on_cpu, on_gpu = lesson.perturbation(cpu, c, 11), lesson.perturbation(gpu, g, 11)
    assert np.array_equal(on_gpu.order, on_cpu.order)
    assert close(on_gpu.attended, on_cpu.attended) <= 1e-4 and close(on_gpu.random, on_cpu.random) <= 1e-4


def test_the_live_camera_on_the_gpu_draws_the_cpus_map(pair, cat):
    cpu, gpu, _c, _g = pair
    frames = [live.heatmap_frame(cat, live.LiveSettings(model, layer=11)) for model in (cpu, gpu)]
    assert close(frames[1].cls_map, frames[0].cls_map) <= 1e-5


def test_the_faithfulness_command_on_the_gpu_writes_the_cpus_numbers(pair, tmp_path):
    cpu, _gpu, c, _g = pair
    out = tmp_path / "cat.json"
    photo = attnviz.photos.sample("cat")
    assert cli.main(["faithfulness", str(photo), "--device", GPU, "--ablation", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    expected = fa.faithfulness(cpu, c)
    by_name = {m["name"]: m for m in record["maps"]}
    for curve in expected.curves + expected.random:
        got = by_name[curve.name]
        if curve in expected.curves:  # random orders are drawn from the seed: the same on both devices
            assert got["order"] == curve.ranking.order.tolist()
        assert close(got["deletion"], curve.deletion) <= 1e-4 and close(got["insertion"], curve.insertion) <= 1e-4
    assert close(record["ablation"], ablation.head_ablation(cpu, c).effect) <= 1e-4


# ---- a classifier: probabilities and class-specific relevance -----------------------------------------------------

@pytest.fixture(scope="module")
def classifier():
    """timm's DeiT-III small with random weights (LayerScale made to count) and its 1000 ImageNet classes."""
    torch.manual_seed(1)
    network = timm.create_model("deit3_small_patch16_224", pretrained=False, num_classes=1000).eval()
    with torch.no_grad():
        for block in network.blocks:
            block.ls1.gamma.uniform_(0.5, 1.5)
            block.ls2.gamma.uniform_(0.5, 1.5)
    return (attnviz.wrap(network, "deit3", "random init", 224),
            attnviz.wrap(copy.deepcopy(network), "deit3", "random init", 224, device=GPU))


def test_relevance_and_probabilities_on_the_gpu_are_the_cpus(classifier, cat):
    cpu, gpu = classifier
    c, g = attnviz.capture(cpu, cat), attnviz.capture(gpu, cat)
    top = int(c.output.argmax())
    assert close(relevance.relevance_map(gpu, g, top), relevance.relevance_map(cpu, c, top)) <= 1e-5
    rankings, _ = fa.standard_rankings(cpu, c)
    on_cpu, on_gpu = fa.faithfulness(cpu, c, rankings), fa.faithfulness(gpu, g, rankings)
    assert on_gpu.measure == "probability" and on_gpu.target == on_cpu.target == top
    for a, b in zip(on_gpu.curves, on_cpu.curves):
        assert close(a.deletion, b.deletion) <= 1e-4 and close(a.insertion, b.insertion) <= 1e-4, a.name


def test_a_gpu_capture_saves_and_loads(classifier, cat, tmp_path):
    g = attnviz.capture(classifier[1], cat)
    path = tmp_path / "cat.npz"
    attnviz.save_capture(path, g)
    back = attnviz.load_capture(path)
    assert close(back.all_weights(), g.all_weights()) <= 1e-6  # recomputed on the CPU from the GPU's q and k


@pytest.mark.parametrize("name, kwargs, size", [("vit_small_patch16_224", {"depth": 2}, 224),
                                                ("swin_tiny_patch4_window7_224", {"depths": (2, 2), "embed_dim": 32,
                                                                                   "num_heads": (2, 4)}, 224)])
def test_the_html_page_of_a_gpu_capture_is_the_cpus(name, kwargs, size):
    """``attnviz.show`` / ``--html``: the page's numbers are quantised on the CPU, wherever the capture is."""
    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **kwargs).eval()
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    models = [attnviz.wrap(network, name, "random init", size),
              attnviz.wrap(copy.deepcopy(network), name, "random init", size, device=GPU)]
    caps = [attnviz.capture_tensor(m, x.to(m.device)) for m in models]
    pages = [html.page(cap) for cap in caps]
    assert len(pages[1]) > 10_000 and pages[1].count("\n") > 10
    # The page around its data is the same: facts, labels, the photo (the maps are gzipped, and one quantisation
    # level crossed changes the rest of the gzip stream, so the data is compared unpacked, below).
    around = [re.sub(r"[A-Za-z0-9+/=]{4000,}", "…", page) for page in pages]  # the base64 blobs cut out
    assert around[0] == around[1] and around[0].count("…") >= 1
    on_cpu, on_gpu = (payload_arrays(cap) for cap in caps)
    assert on_cpu.keys() == on_gpu.keys() and any(name.startswith("rows") for name in on_cpu)
    for name, a in on_cpu.items():
        b = on_gpu[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if a.dtype == np.uint8:  # 256 levels per row: the devices' float32 rounding may cross a level, now and then
            steps = np.abs(a.astype(np.int16) - b.astype(np.int16))
            assert steps.max() <= 1 and (steps > 0).mean() <= 0.01, (name, steps.max(), (steps > 0).mean())
        elif a.dtype.kind == "f":
            assert close(a, b) <= 1e-5 * max(1.0, float(np.abs(a).max())), name
        else:
            assert np.array_equal(a, b), name


def payload_arrays(cap) -> dict[str, np.ndarray]:
    """The arrays inside an HTML page's gzipped data (``html.payload``), unpacked by its own index."""
    data, index = html.payload(cap)
    raw = gzip.decompress(data)
    return {name: np.frombuffer(raw, np.dtype(dtype), int(np.prod(shape)), offset).reshape(shape)
            for name, (offset, dtype, shape) in index.items()}


# ---- the page's own sentences, measured on the GPU's capture --------------------------------------------------------

def test_the_depth_tip_on_the_gpu_is_the_cpus(pair):
    """``stats.class_token_spread``: the "How to read this map" tip's entropies, every layer at once."""
    _cpu, _gpu, c, g = pair
    on_cpu, on_gpu = stats.class_token_spread(c), stats.class_token_spread(g)
    assert close(on_gpu.mean_map, on_cpu.mean_map) <= 1e-5 and close(on_gpu.heads, on_cpu.heads) <= 1e-5
    assert on_gpu.num_tokens == on_cpu.num_tokens == 1 + 14 * 14
    assert on_cpu.mean_map.shape == (12,) and np.ptp(on_cpu.mean_map) > 1.0  # the tip names two different layers
    named = [(s.focused_layer, int(s.mean_map.argmax())) for s in (on_gpu, on_cpu)]
    assert named[0] == named[1]


def test_the_ablation_grids_statistics_on_the_gpu_are_the_cpus(pair):
    """``ablation.head_statistics``: the grid beside the effects (its sentence: the grid test above)."""
    _cpu, _gpu, c, g = pair
    for a, b in zip(ablation.head_statistics(g), ablation.head_statistics(c)):
        assert a.shape == (12, 6) and close(a, b) <= 1e-5


def test_the_qk_map_and_its_closeness_sentence_on_the_gpu_are_the_cpus(pair):
    """``qkmap.qk_map`` and ``statistics`` (the ρ behind "closeness on this map …") from a GPU capture."""
    _cpu, _gpu, c, g = pair
    for layer, head in [(0, 0), (11, 5)]:
        a, b = qkmap.qk_map(g, layer, head), qkmap.qk_map(c, layer, head)
        assert close(a.logits[0], b.logits[0]) <= 1e-4 * float(np.abs(b.logits[0]).max())
        assert close(np.abs(a.xy), np.abs(b.xy)) <= 1e-3 * float(np.abs(b.xy).max())  # PCA: up to each axis's sign
        sa, sb = qkmap.statistics(a), qkmap.statistics(b)
        assert abs(sa.distance_rho - sb.distance_rho) <= 1e-3 and sa.closeness == sb.closeness, (layer, head)


PRESSED = ("faith_run", "ablation_run", "perturb_run", "lesson_faith_run")  # the experiments' buttons
TIMING = re.compile(r"\n- \*\*Forward pass with capture:\*\*[^\n]*")  # how long it took: not what it found


def opened(device: str | None, page: str | None = None) -> AppTest:
    """The real app on the offline model and the cat photo, on ``device`` (None: the page's default), at
    ``page`` (a script under attnviz_app/, None: Explore)."""
    at = AppTest.from_file(str(APP), default_timeout=600)
    if device is not None:
        at.session_state["device"] = device
    (at.switch_page(page) if page else at).run()
    assert not at.exception, [e.value for e in at.exception]
    if torch.cuda.is_available():  # the Device box is drawn only where there is a GPU
        assert at.selectbox(key="device").value == (device or "cuda")
    return at


def said(at: AppTest) -> list[str]:
    """What the page says once its experiments have run: markdown, captions, notes, and each table's rows."""
    for key in PRESSED:
        if any(b.key == key for b in at.button):
            at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    main = at.main
    words = [TIMING.sub("", e.value) for kind in (main.markdown, main.caption, main.info, main.success, main.warning)
             for e in kind]
    for table in main.dataframe:  # rows in the order of their words: two maps of equal area may swap ranks
        rows = [" | ".join(map(str, row)) for row in table.value.to_numpy().tolist()]
        words += sorted(rows, key=lambda row: NUMBER.sub("#", row))
    return words


def page_texts(device: str | None) -> dict[str, list[str]]:
    """What every view of the Explore page says on ``device``, and the lesson."""
    at = opened(device)
    texts = {}
    for view in views.registered():
        at.selectbox(key="view").set_value(view).run()
        texts[view] = said(at)
    texts["lesson"] = said(opened(device, "screens/lesson.py"))
    return texts


def test_every_view_and_the_lesson_say_on_the_gpu_what_they_say_on_the_cpu():
    """The app's default device is the GPU where there is one: every view and the lesson run there (no traceback,
    no error), and each sentence, number and table row they show is the one the CPU's page shows."""
    on_gpu = page_texts(None if GPU == "cuda" else GPU)
    on_cpu = page_texts("cpu")
    assert list(on_gpu) == list(on_cpu) and sum(map(len, on_cpu.values())) > 60
    differ = {view: [(a, b) for a, b in zip(on_gpu[view], on_cpu[view]) if not same_but_rounding(a, b)]
              for view in on_cpu}
    differ = {v: d for v, d in differ.items() if d or len(on_gpu[v]) != len(on_cpu[v])}
    assert not differ, json.dumps(differ, ensure_ascii=False, indent=1)[:6000]
