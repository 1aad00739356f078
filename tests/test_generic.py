"""The generic path (attnviz.adapters.generic): models no adapter was written for, read through the attention
calls PyTorch makes, against each model's own eager attention on the same weights, to 1e-5 on every layer and head.

Every model has random weights with its q and k projections scaled ×6 (generic_models.PEAK), so attention is
peaked (each test checks its largest weight) and a wrong logit shows. The references are computed apart from the
capture: hand-written float64 softmax loops, nn.MultiheadAttention's own ``need_weights=True,
average_attn_weights=False``, Hugging Face's ``attn_implementation="eager"`` with ``output_attentions``.
"""
from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F

import attnviz
from attnviz import ModelError
from attnviz.capture import capture_tensor
from generic_models import PEAK, HandViT, MhaAttention, SdpaAttention, hf_swin, mha_vit, sdpa_vit, sharpen

EXACT = 1e-5


def check(cap: attnviz.Capture, references: list[torch.Tensor]) -> float:
    """max |Δ| over every layer, head and weight; each layer's reference is (H, L, S)."""
    assert cap.num_layers == len(references)
    worst = 0.0
    for layer, ref in enumerate(references):
        ours = cap.window_weights(layer)[0].double()  # (H, Tq, Tk): one window per layer here
        assert ours.shape == ref.shape, layer
        worst = max(worst, float((ours - ref).abs().max()))
    assert max(float(r.max()) for r in references) > 0.9  # peaked: a wrong logit would show
    assert worst < EXACT, worst
    return worst


def capture_and_reference(network: HandViT, size: int = 32, **layout):
    model = attnviz.wrap(network, "hand", "random weights", size, **layout)
    torch.manual_seed(5)
    x = torch.randn(1, 3, size, size)
    cap = capture_tensor(model, x)
    network.record()
    with torch.inference_mode():
        expected = network(x)
    assert torch.allclose(cap.output, expected[0], atol=1e-5)  # the pass under the interception computed the same
    return model, cap, network.references()


# ---- hand-written ViTs ----------------------------------------------------------------------------------


def test_a_hand_written_sdpa_vit_is_read_exactly_with_its_layout_inferred():
    model, cap, refs = capture_and_reference(sdpa_vit())
    assert model.adapter.family.startswith("generic")
    assert (model.grid, model.num_prefix_tokens, model.has_class_token) == ((4, 4), 1, True)  # stride 8, cls_token
    assert cap.uniform and cap.summary == "cls"
    check(cap, refs)
    assert cap.cls_map(1, "mean").shape == (4, 4)


def test_masks_causal_scale_and_grouped_keys_are_read_as_sdpa_computes_them():
    torch.manual_seed(2)
    n = 17
    boolean = torch.rand(n, n) > 0.4
    boolean |= torch.eye(n, dtype=torch.bool)  # every query keeps one key
    additive = torch.randn(1, 4, n, n) * 3.0  # per-head float bias
    attentions = [SdpaAttention(32, 4, mask=boolean), SdpaAttention(32, 4, mask=additive),
                  SdpaAttention(32, 4, causal=True, scale=0.3), SdpaAttention(32, 4, kv_heads=2)]
    network = sharpen(HandViT(attentions))
    _, cap, refs = capture_and_reference(network)
    check(cap, refs)
    masked = cap.window_weights(0)[0]  # (H, N, N): nothing where the boolean mask said no
    assert float(masked[:, ~boolean].abs().max()) == 0.0
    causal = cap.window_weights(2)[0]
    assert float(causal.triu(1).abs().max()) == 0.0 and float(causal[:, 0, 0].min()) == 1.0


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_multihead_attention_vit_matches_the_modules_own_per_head_weights(need_weights):
    """need_weights=False: the module's SDPA call is read; True: its own q · d_k^-1/2 · kᵀ (baddbmm / bmm)."""
    _, cap, refs = capture_and_reference(mha_vit(need_weights))
    check(cap, refs)


def test_multihead_attention_masks_boolean_and_additive():
    torch.manual_seed(3)
    n = 17
    boolean = (torch.rand(n, n) > 0.5) | torch.eye(n, dtype=torch.bool)
    boolean = ~boolean  # nn.MultiheadAttention: True means *not* allowed
    additive = torch.randn(n, n) * 2.0
    network = sharpen(HandViT([MhaAttention(32, 4, False, boolean), MhaAttention(32, 4, True, additive)]))
    _, cap, refs = capture_and_reference(network)
    check(cap, refs)
    assert float(cap.window_weights(0)[0][:, boolean].abs().max()) == 0.0


def test_no_class_token_and_a_layout_given_by_the_caller():
    torch.manual_seed(4)
    network = sharpen(HandViT([SdpaAttention(32, 4)] * 1, class_token=False))
    model, cap, refs = capture_and_reference(network)
    assert (model.num_prefix_tokens, model.has_class_token, cap.summary) == (0, False, "mean_received")
    check(cap, refs)
    # no patch embedding to read the grid from: the caller says it; an ambiguous one is refused in one sentence
    network.patch_embed = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, 1, 1), torch.nn.Conv2d(32, 32, 8, 8))
    with pytest.raises(ModelError, match=r"^attnviz cannot tell which image patch .* pass grid=\(rows, columns\) to "
                                         r"attnviz.wrap\.$"):
        attnviz.wrap(network, "hand", "random", 32)
    model = attnviz.wrap(network, "hand", "random", 32, grid=(4, 4), prefix=0)
    assert model.grid == (4, 4) and capture_tensor(model, torch.randn(1, 3, 32, 32)).num_tokens == 16


def test_prefix_tokens_the_structure_does_not_explain_are_refused_until_the_caller_says():
    network = sdpa_vit()
    network.cls_token = None  # token 0 is still there (see below), but no parameter says it is a class token
    network.extra = torch.nn.Parameter(torch.randn(1, 1, 32))

    def forward(x):
        x = network.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([network.extra.expand(len(x), -1, -1), x], 1) + network.pos
        for block in network.blocks:
            x = block(x)
        return x[:, 0]

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = network

        def forward(self, x):
            return forward(x)

    wrapper = Wrapper().eval()
    with pytest.raises(ModelError, match=r"attention call 1 has 17 keys, which are not 0 prefix tokens .* and a 4 × 4 "
                                         r"grid, .* pass grid=\(rows, columns\) and prefix=k"):
        attnviz.wrap(wrapper, "w", "random", 32)
    model = attnviz.wrap(wrapper, "w", "random", 32, prefix=1)
    assert (model.num_prefix_tokens, model.has_class_token) == (1, False)


# ---- what the generic path refuses -------------------------------------------------------------------------


class HandSoftmax(torch.nn.Module):
    """Attention computed by hand: q · kᵀ, softmax, · v. No PyTorch attention call to read."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.heads = torch.nn.Linear(dim, 3 * dim), heads

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return ((q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)


def test_attention_by_hand_is_refused_in_one_sentence():
    with pytest.raises(ModelError) as error:
        attnviz.wrap(HandViT([HandSoftmax(), HandSoftmax()]), "hand", "random", 32)
    assert str(error.value) == (
        "HandViT computes its attention softmax by hand, not through scaled_dot_product_attention or "
        "nn.MultiheadAttention, so attnviz cannot read it exactly and refuses it rather than show attention weights "
        "that may be wrong.")


def test_a_model_whose_attention_calls_are_only_part_of_its_attention_is_refused():
    with pytest.raises(ModelError) as error:
        attnviz.wrap(HandViT([SdpaAttention(32, 4), HandSoftmax()]), "hand", "random", 32)
    assert str(error.value) == (
        "HandViT makes 1 attention calls through PyTorch but also takes 1 softmax over tokens by hand, so part of its "
        "attention is not in those calls; attnviz refuses it rather than show part of its attention.")
    # found by its attention modules too: a module named as attention that makes no call
    network = HandViT([SdpaAttention(32, 4), SdpaAttention(32, 4)])
    network.blocks[1].attention = torch.nn.Identity()
    network.blocks[1].extra = SdpaAttention(32, 4)  # an attention module the forward pass never calls
    with pytest.raises(ModelError) as error:
        attnviz.wrap(network, "hand", "random", 32)
    assert str(error.value).startswith("HandViT has 2 attention modules (SdpaAttention) but makes 1 attention calls "
                                       "through PyTorch, so some compute their softmax by hand;")


def test_grid_and_prefix_are_refused_for_a_model_its_family_reads(tiny):
    with pytest.raises(ModelError, match=r"^grid= and prefix= are for models attnviz reads through their PyTorch"):
        attnviz.wrap(tiny.network, "tiny", "random", 32, grid=(4, 4))


# ---- one shared model, many threads -------------------------------------------------------------------------


def test_interception_is_per_thread_while_another_thread_runs_the_same_network():
    network = sdpa_vit()
    model = attnviz.wrap(network, "hand", "random", 32)
    x = torch.randn(1, 3, 32, 32)
    others: list = []

    def run_elsewhere():  # mid-capture, on another thread: must neither be read nor disturb the capture
        with torch.inference_mode():
            others.append(network(x))

    with torch.inference_mode():
        plain = network(x)

    def between_layers():
        if not others:
            t = threading.Thread(target=run_elsewhere)
            t.start()
            t.join()

    cap = capture_tensor(model, x, between_layers=between_layers)
    network.record()
    with torch.inference_mode():
        network(x)
    check(cap, network.references())
    # the other thread's pass ran once, unread (the capture above holds this thread's calls only) and undisturbed: its
    # output is the plain pass's (to float32's last bits: on a loaded host xdist saw one differ by ~1e-7, a matmul split)
    assert len(others) == 1 and torch.allclose(others[0], plain, rtol=0, atol=1e-6)


# ---- torchvision ---------------------------------------------------------------------------------------


def torchvision_capture(model, x) -> tuple[attnviz.Capture, list[torch.Tensor]]:
    """The capture, and each encoder block's nn.MultiheadAttention run again on the input it had in that very pass
    with need_weights=True, per head (in float32 a base-size model's two passes drift apart over 12 peaked layers)."""
    network = model.network
    inputs: list[torch.Tensor] = []
    handles = [layer.self_attention.register_forward_pre_hook(lambda m, args: inputs.append(args[0].clone()))
               for layer in network.encoder.layers]
    cap = capture_tensor(model, x)
    for h in handles:
        h.remove()
    with torch.inference_mode():
        return cap, [layer.self_attention(a, a, a, need_weights=True, average_attn_weights=False)[1][0].double()
                     for layer, a in zip(network.encoder.layers, inputs)]


def test_torchvision_vit_b_16_is_exact_against_its_own_need_weights():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    network = sharpen(torchvision.models.vit_b_16(weights=None))
    model = attnviz.wrap(network, "vit_b_16", "random weights", 224)
    assert (model.grid, model.num_prefix_tokens, model.has_class_token, model.depth) == ((14, 14), 1, True, 12)
    x = torch.randn(1, 3, 224, 224)
    check(*torchvision_capture(model, x))


def test_torchvision_swin_t_is_refused_as_attention_by_hand():
    torchvision = pytest.importorskip("torchvision")
    with pytest.raises(ModelError) as error:
        attnviz.wrap(torchvision.models.swin_t(weights=None), "swin_t", "random", 224)
    assert str(error.value).startswith("torchvision's SwinTransformer computes its attention softmax by hand in "
                                       "ShiftedWindowAttention, not through scaled_dot_product_attention")


# ---- Hugging Face ---------------------------------------------------------------------------------------


def siglip(attn: str, head: bool = True):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                                             num_attention_heads=4, image_size=32, patch_size=8, vision_use_head=head)
    config._attn_implementation = attn
    network = transformers.SiglipVisionModel(config).eval()
    with torch.no_grad():
        for m in network.modules():
            if type(m).__name__ == "SiglipAttention":
                m.q_proj.weight *= PEAK
                m.k_proj.weight *= PEAK
    return sharpen(network)


def test_hugging_face_siglip_with_its_pooling_head_is_exact_against_eager():
    network = siglip("sdpa")
    model = attnviz.wrap(network, "siglip", "random weights", 32)
    assert (model.grid, model.num_prefix_tokens, model.has_class_token, model.depth) == ((4, 4), 0, False, 3)
    x = torch.randn(1, 3, 32, 32)
    cap = capture_tensor(model, x)
    eager = copy.deepcopy(network)
    eager.config._attn_implementation = "eager"
    for m in eager.modules():
        if hasattr(m, "config"):
            m.config._attn_implementation = "eager"
    probe: list = []
    attention = eager.head.attention
    handle = attention.register_forward_pre_hook(lambda m, args: probe.append(args))
    with torch.inference_mode():
        out = eager(pixel_values=x, output_attentions=True)
        handle.remove()
        head = attention(*probe[0], need_weights=True, average_attn_weights=False)[1][0].double()  # (H, 1, 16)
    refs = [a[0].double() for a in out.attentions] + [head]
    check(cap, refs)
    last = cap.layout(2)  # the probe: its own query over the 16 patches
    assert (last.num_windows, last.windows.shape[1], last.num_keys) == (1, 1, 16)
    assert cap.summary_map(2, "mean").shape == (4, 4)


def test_hugging_face_eager_attention_is_refused_with_what_to_load():
    with pytest.raises(ModelError, match=r"^Hugging Face's SiglipVisionModel computes its attention softmax by hand in "
                                         r"SiglipAttention, not through .* \(load it with attn_implementation=\"sdpa\"\)"):
        attnviz.wrap(siglip("eager", head=False), "siglip", "random", 32)


# ---- where it shows: the library's and the CLI's --model module:callable, the owner's folder -------------------


def test_a_python_builder_loads_by_module_and_callable():
    model = attnviz.load_model("generic_models:sdpa_vit", device="cpu")
    assert (model.name, model.size, model.adapter.family) == ("py:generic_models:sdpa_vit", 32, "generic (PyTorch attention calls)")
    assert model.notes and "ImageNet's mean" in model.notes[0]
    assert attnviz.load_model("py:generic_models:sdpa_vit", device="cpu").public_name == "generic_models:sdpa_vit"
    with pytest.raises(ModelError, match=r"^generic_models has no callable nothing, so generic_models:nothing builds"):
        attnviz.load_model("generic_models:nothing", device="cpu")
    with pytest.raises(ModelError, match=r"^Could not import no_such_module for the builder no_such_module:build: "):
        attnviz.load_model("no_such_module:build", device="cpu")


def test_the_cli_exports_a_model_built_by_a_python_callable(tmp_path):
    import numpy as np
    from PIL import Image

    from attnviz import cli

    Image.new("RGB", (40, 30), (200, 100, 50)).save(tmp_path / "p.png")
    out = tmp_path / "out"
    assert cli.main(["export", str(tmp_path / "p.png"), "--out", str(out), "--model", "generic_models:sdpa_vit",
                     "--device", "cpu"]) == 0
    saved = np.load(out / "p.npz")
    model = attnviz.load_model("generic_models:sdpa_vit", device="cpu")
    cap = attnviz.load_capture(out / "p.npz")
    assert saved["attention"].shape == (2, 4, 17, 17)
    again = attnviz.capture(model, Image.open(tmp_path / "p.png"))
    assert float(np.abs(saved["attention"] - np.stack([again.layer_weights(i).numpy() for i in range(2)])).max()) < 1e-6
    assert cap.num_layers == 2


def test_the_owners_folder_lists_a_builder_and_the_page_loads_it(tmp_path):
    from attnviz import serving

    (tmp_path / "my-vit.builder").write_text("generic_models:sdpa_vit\n")
    (tmp_path / "bad.builder").write_text("import os; os.system('x')\n")  # not module:callable: not listed
    entries = serving.list_checkpoints(tmp_path)
    assert [(e.label, e.arch, e.is_folder) for e in entries] == [("my-vit", "py:generic_models:sdpa_vit", True)]
    assert entries[0].files()[0].name == "generic_models.py"
    assert serving.model_parameters("py:generic_models:sdpa_vit") == sum(
        p.numel() for p in attnviz.load_model("py:generic_models:sdpa_vit", device="cpu").network.parameters())


def test_every_view_of_the_page_draws_or_refuses_in_one_sentence_on_a_builders_model(tmp_path, monkeypatch):
    """The owner lists a builder: the page loads it, says how its photos were normalised, and each view draws (or
    gives its one-sentence refusal) with no exception, as for any other model."""
    from streamlit.testing.v1 import AppTest

    from attnviz_app import views
    from conftest import APP

    (tmp_path / "my-vit.builder").write_text("generic_models:sdpa_vit\n")
    monkeypatch.setenv("ATTNVIZ_CHECKPOINTS", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params["model"] = "ckpt:my-vit"
    at.run()
    assert not at.exception and at.selectbox(key="model_choice").value == "ckpt:my-vit"
    assert any("does not say how its photos are normalised" in i.value for i in at.info)
    assert at.slider(key="layer").max == 2  # the builder's two blocks, not the default's twelve
    for name in views.registered():
        at.selectbox(key="view").set_value(name).run()
        assert not at.exception, (name, [e.value for e in at.exception])
        assert not at.error, (name, [e.value for e in at.error])


# ---- Hugging Face's Swin: one SDPA call per block over every window of the image ---------------------------


def swin_capture(model, x: torch.Tensor) -> tuple[attnviz.Capture, list[torch.Tensor]]:
    """The capture, and every SwinAttention run again with attn_implementation="eager" on the inputs it had in that
    very pass: its (nW, H, T, T) weights (in float32 two passes drift apart by ~1e-5 over a few peaked stages)."""
    network = model.network
    attentions = [m for m in network.modules() if type(m).__name__ == "SwinAttention"]
    inputs: list = []
    handles = [m.register_forward_pre_hook(lambda m, args, kwargs: inputs.append((m, args, kwargs)), with_kwargs=True)
               for m in attentions]
    cap = capture_tensor(model, x)
    for h in handles:
        h.remove()
    refs = []
    for attention, args, kwargs in inputs:
        eager = copy.deepcopy(attention)  # its own copy of the config
        eager.config._attn_implementation = "eager"
        with torch.inference_mode():
            refs.append(eager(*args, **kwargs)[1].double())
    return cap, refs


def eager_swin(network: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same weights run as a whole with attn_implementation="eager" and output_attentions=True: each stage's
    last block's (nW, H, T, T) weights."""
    eager = copy.deepcopy(network)
    for m in eager.modules():
        if hasattr(m, "config"):
            m.config._attn_implementation = "eager"
    with torch.inference_mode():
        return eager(pixel_values=x, output_attentions=True).attentions


def hf_partition(layer: torch.nn.Module, grid: tuple[int, int]) -> torch.Tensor:
    """(W, T): the grid token of each window row, by the Swin layer's own roll and window_partition of a map of
    token numbers."""
    from transformers.models.swin.modeling_swin import window_partition

    tokens = torch.arange(grid[0] * grid[1], dtype=torch.float64).reshape(1, *grid, 1)
    windows = window_partition(layer.cyclic_shift(tokens), layer.window_size)
    return windows.reshape(windows.shape[0], -1).long()


def test_hugging_face_swin_is_exact_against_eager_with_its_windows_on_the_image():
    pytest.importorskip("transformers")
    from attnviz.errors import NoClassTokenError

    network = hf_swin("sdpa")
    model = attnviz.wrap(network, "swin", "random weights", 64)
    assert (model.grid, model.num_prefix_tokens, model.has_class_token, model.depth) == ((16, 16), 0, False, 6)
    torch.manual_seed(5)
    x = torch.randn(1, 3, 64, 64)
    cap, refs = swin_capture(model, x)
    per_stage = eager_swin(network, x)  # a second pass, all eager: output_attentions, drifted by float32 only
    assert len(refs) == 6 and [tuple(a.shape) for a in per_stage] == [(16, 2, 16, 16), (4, 2, 16, 16), (1, 4, 16, 16)]
    for stage, last in enumerate((1, 3, 5)):
        assert float((cap.window_weights(last).double() - per_stage[stage].double()).abs().max()) < 1e-4
    # stage, block, grid, window, shift, windows: the 4 × 4 stage clamps its second block's shift to 0
    layouts = [(lay.stage, lay.block, lay.grid, lay.window, lay.shift, lay.num_windows, lay.patch)
               for lay in cap.layouts]
    assert layouts == [(0, 0, (16, 16), (4, 4), (0, 0), 16, 4), (0, 1, (16, 16), (4, 4), (2, 2), 16, 4),
                       (1, 0, (8, 8), (4, 4), (0, 0), 4, 8), (1, 1, (8, 8), (4, 4), (2, 2), 4, 8),
                       (2, 0, (4, 4), (4, 4), (0, 0), 1, 16), (2, 1, (4, 4), (4, 4), (0, 0), 1, 16)]
    worst = 0.0
    for layer, ref in enumerate(refs):  # every window of every head, (W, H, T, T)
        ours = cap.window_weights(layer).double()
        assert ours.shape == ref.shape, layer
        worst = max(worst, float((ours - ref).abs().max()))
    assert worst < EXACT, worst
    assert min(float(r.amax(-1).mean()) for r in refs) > 0.7  # peaked in every layer: a wrong logit would show
    # each window's rows are the grid tokens the model's own roll and partition put there
    layers = [m for m in network.modules() if type(m).__name__ == "SwinLayer"]
    for layer, (lay, swin_layer) in enumerate(zip(cap.layouts, layers)):
        assert torch.equal(lay.windows, hf_partition(swin_layer, lay.grid)), layer
    shifted = cap.layout(1).windows  # rolled by −2: window 0 is rows 2…5, columns 2…5; the last wraps round
    assert shifted[0].tolist() == [r * 16 + c for r in range(2, 6) for c in range(2, 6)]
    assert shifted[15].tolist() == [r * 16 + c for r in (14, 15, 0, 1) for c in (14, 15, 0, 1)]
    # over the whole image: each window's block where its tokens are, every row summing to 1, zero elsewhere
    full = cap.layer_weights(1).double()  # (H, 256, 256)
    assert torch.allclose(full[:, shifted[15][:, None], shifted[15][None, :]], refs[1][15], atol=EXACT)
    assert torch.allclose(full.sum(-1), torch.ones(2, 256, dtype=torch.float64), atol=1e-5)
    assert float(full[:, shifted[0][0], shifted[1]].abs().max()) == 0.0  # token 34 sees nothing of window 1
    # no class token: the summary is the mean each patch receives, placed on the image by the windows
    assert cap.summary == "mean_received" and not cap.has_class_token
    with pytest.raises(NoClassTokenError):
        cap.cls_map(0, "mean")
    for layer in (0, 1, 4):
        lay = cap.layout(layer)
        received = refs[layer].mean(1).mean(1)  # (W, T): heads' mean, then over the window's queries
        expected = torch.zeros(lay.grid[0] * lay.grid[1], dtype=torch.float64)
        expected[lay.windows.reshape(-1)] = received.reshape(-1)
        summary = cap.summary_map(layer, "mean")
        assert summary.shape == lay.grid
        assert float(abs(summary - expected.reshape(lay.grid).numpy()).max()) < EXACT, layer


def test_hugging_face_swin_classifier_at_224_px_window_7_needs_no_padding_and_is_exact():
    """Swin-T's geometry (patch 4, window 7 at 224 px: 56, 28, 14 and 7 tokens a side) on a narrow classifier."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=224, patch_size=4, embed_dim=12, depths=[2, 2, 2, 2],
                                     num_heads=[1, 1, 2, 2], window_size=7, num_labels=5)
    config._attn_implementation = "sdpa"
    network = transformers.SwinForImageClassification(config).eval()
    with torch.no_grad():
        for m in network.modules():
            if type(m).__name__ == "SwinAttention":
                m.q_proj.weight *= 4 * PEAK
                m.k_proj.weight *= 4 * PEAK
    model = attnviz.wrap(network, "swin-t shape", "random weights", 224)
    assert [(lay.grid, lay.shift, lay.num_windows) for lay in model.adapter.layouts] == [
        ((56, 56), (0, 0), 64), ((56, 56), (3, 3), 64), ((28, 28), (0, 0), 16), ((28, 28), (3, 3), 16),
        ((14, 14), (0, 0), 4), ((14, 14), (3, 3), 4), ((7, 7), (0, 0), 1), ((7, 7), (0, 0), 1)]
    x = torch.randn(1, 3, 224, 224)
    cap, refs = swin_capture(model, x)
    with torch.inference_mode():
        assert torch.allclose(cap.output, network(pixel_values=x).logits[0], atol=1e-5)  # the 5 logits
    assert max(float((cap.window_weights(layer).double() - ref).abs().max()) for layer, ref in enumerate(refs)) < EXACT
    assert min(float(r.max()) for r in refs) > 0.9  # peaked in every layer


def test_hugging_face_swin_refuses_padding_and_windows_it_cannot_place():
    transformers = pytest.importorskip("transformers")
    network = hf_swin("sdpa")
    with pytest.raises(ModelError) as error:  # 80 px: the 10 × 10 second stage would be padded to 12 × 12
        attnviz.wrap(network, "swin", "random", 80)
    assert str(error.value) == (
        "At 80 px, attention call 3 of Hugging Face's SwinModel has a 10 × 10 token grid that does not divide into "
        "4 × 4 windows, so the model pads it with tokens that are not in the photo; attnviz refuses that size rather "
        "than show them (use a size where every stage divides).")
    with pytest.raises(ModelError, match=r"^Hugging Face's SwinModel's attention call 1 is over windows of its token "
                                         r"grid, which hold no prefix tokens, so attnviz cannot read it with 1 prefix"):
        attnviz.wrap(network, "swin", "random", 64, prefix=1)
    # a shifted block whose mask does not separate the regions the roll joined: not Swin's windows, not guessed
    unmasked = hf_swin("sdpa")
    second = [m for m in unmasked.modules() if type(m).__name__ == "SwinLayer"][1]
    second.get_attn_mask = lambda *args, **kwargs: None
    with pytest.raises(ModelError) as error:
        attnviz.wrap(unmasked, "swin", "random", 64)
    assert str(error.value) == (
        "Hugging Face's SwinModel's attention call 2 is over windows of a 16 × 16 grid shifted by 2, but its mask "
        "does not separate the regions that shift joins as Swin's does, so attnviz cannot tell where its windows "
        "lie and refuses it rather than guess.")
    # Swin V2 takes its cosine attention's softmax by hand, and this transformers has no SDPA path for it to load
    assert not transformers.Swinv2Model._supports_sdpa
    config = transformers.Swinv2Config(image_size=32, patch_size=4, embed_dim=16, depths=[2], num_heads=[2],
                                       window_size=4)
    with pytest.raises(ModelError) as error:
        attnviz.wrap(transformers.Swinv2Model(config).eval(), "swinv2", "random", 32)
    assert str(error.value) == (
        "Hugging Face's Swinv2Model computes its attention softmax by hand in Swinv2SelfAttention, not through "
        "scaled_dot_product_attention or nn.MultiheadAttention, so attnviz cannot read it exactly and refuses it "
        "rather than show attention weights that may be wrong.")  # no "load it with sdpa": there is none


class WindowsByHand(torch.nn.Module):
    """SDPA over the 4 × 4 grid cut into four windows of four tokens, by a module that does not say where they lie."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.heads = torch.nn.Linear(dim, 3 * dim), heads

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b * 4, n // 4, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # (4B, H, 4, d)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)


def test_windows_no_module_places_are_still_refused_in_one_sentence():
    with pytest.raises(ModelError) as error:
        attnviz.wrap(HandViT([WindowsByHand()], class_token=False), "hand", "random", 32)
    assert str(error.value) == (
        "HandViT computes its attention call 1 over 4 windows of 4 tokens per image, whose places on the image the "
        "generic path does not infer, so attnviz refuses it rather than guess them.")


def test_the_page_draws_a_hugging_face_swin_from_a_builder(tmp_path, monkeypatch):
    """The owner lists a builder of Hugging Face's SwinModel: the page loads it through the generic path, opens on
    the stages view with its three grids, and draws that and the summary and matrix views with no exception."""
    pytest.importorskip("transformers")
    from streamlit.testing.v1 import AppTest

    from conftest import APP

    (tmp_path / "hf-swin.builder").write_text("generic_models:hf_swin\n")
    monkeypatch.setenv("ATTNVIZ_CHECKPOINTS", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params["model"] = "ckpt:hf-swin"
    at.run()
    assert not at.exception and at.selectbox(key="model_choice").value == "ckpt:hf-swin"
    assert at.selectbox(key="view").value == "stages" and at.selectbox(key="stage").options == [
        "Stage 1 (16 × 16 tokens, 4 px each)", "Stage 2 (8 × 8 tokens, 8 px each)", "Stage 3 (4 × 4 tokens, 16 px each)"]
    assert any("has 3 stages, each with its own grid of tokens (16 × 16, 8 × 8, 4 × 4)" in i.value for i in at.info)
    for name in ("cls", "matrix", "stages"):
        at.selectbox(key="view").set_value(name).run()
        assert not at.exception, (name, [e.value for e in at.exception])
        assert not at.error, (name, [e.value for e in at.error])
