"""Each mistake a new user makes gets one clear sentence, never a library traceback or a silent number."""
from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

import attnviz
from attnviz import ModelError, NoClassTokenError
from attnviz.capture import capture_tensor
from attnviz.rollout import rollout_map


@pytest.fixture
def cap(tiny):
    return capture_tensor(tiny, torch.randn(1, 3, 32, 32))


def test_layer_must_be_a_whole_number(cap):
    with pytest.raises(TypeError, match=r"layer must be a whole number \(0-based\), not 11.0"):
        cap.weights(11.0, 0)
    with pytest.raises(TypeError, match="layer must be a whole number"):
        cap.row(True, 0)
    with pytest.raises(IndexError, match=r"layer 2 is outside 0…1"):
        cap.weights(2, 0)


def test_head_true_is_not_head_1(cap):
    with pytest.raises(ValueError, match=r"head must be 0…3 or one of \('mean', 'max', 'min'\), not True"):
        cap.weights(0, True)
    with pytest.raises(ValueError, match="not 'avg'"):
        cap.cls_map(0, "avg")


def test_query_token_range(cap):
    with pytest.raises(IndexError, match=r"query token -1 is outside 0…16"):
        cap.row(0, 0, -1)


def test_capture_wants_a_picture(tiny, tmp_path):
    with pytest.raises(TypeError, match=r"capture\(\) takes a PIL image, not ndarray \(for an array use Image.fromarray"):
        attnviz.capture(tiny, np.zeros((32, 32, 3), dtype=np.uint8))
    with pytest.raises(TypeError, match=r"not the path 'path.jpg': open it first, capture\(model, Image.open\(path\)\)"):
        attnviz.capture(tiny, "path.jpg")


def test_fit_pad_is_not_crop(tiny):
    from PIL import Image

    with pytest.raises(ValueError, match=r"fit must be one of \('crop', 'squash'\), not 'pad'"):
        attnviz.capture(tiny, Image.new("RGB", (40, 30)), fit="pad")


def test_rollout_query_range(cap):
    with pytest.raises(IndexError, match=r"query token 500 is outside 0…16"):
        rollout_map(cap, query=500)
    with pytest.raises(IndexError, match=r"query token -1 is outside 0…16 \(negative indices are not accepted\)"):
        rollout_map(cap, query=-1)


def test_size_zero_is_not_the_default():
    with pytest.raises(ModelError, match="The input size must be a positive whole number of pixels, not 0."):
        attnviz.load_model(size=0, device="cpu")
    with pytest.raises(ModelError, match="not True"):
        attnviz.load_model(size=True, device="cpu")


def test_a_batch_is_refused_not_cut_to_its_first_image(tiny):
    with pytest.raises(ValueError, match="takes one image, not a batch of 2: capture each image on its own"):
        capture_tensor(tiny, torch.randn(2, 3, 32, 32))
    with pytest.raises(TypeError, match=r"takes a \(1, 3, S, S\) torch tensor, not ndarray"):
        capture_tensor(tiny, np.zeros((1, 3, 32, 32)))


def test_not_a_vit_is_refused_at_wrap():
    import torchvision

    with pytest.raises(ModelError, match=r"torchvision.s ResNet \(not timm.s\) is not a Vision Transformer attnviz can read \(it has no patch embedding"):
        attnviz.wrap(torchvision.models.resnet18(), "resnet", "random", 224)
    with pytest.raises(ModelError, match="wrap.. needs a torch.nn.Module"):
        attnviz.wrap("vit_small_patch16_224", "x", "y", 224)


def test_sam_padded_windows_and_differential_attention_are_refused_at_wrap():
    sam = timm.create_model("samvit_base_patch16", pretrained=False, img_size=64, depth=2, embed_dim=64,
                            num_heads=2, global_attn_indexes=(), window_size=3)
    padded = (r"At 64 px, VisionTransformerSAM has a 4 × 4 token grid that does not divide into its 3 × 3 windows, "
              r"so the model pads it with tokens that are not in the photo")
    with pytest.raises(ModelError, match=padded):
        attnviz.wrap(sam, "sam", "random", 64)
    diff = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, attn_layer="diff")
    with pytest.raises(ModelError, match="cannot yet reproduce differential attention exactly"):
        attnviz.wrap(diff, "diff", "random", 32)


def test_unknown_attention_is_refused_not_guessed():
    class MyAttention(timm.layers.Attention):  # a subclass may change the logits: not trusted
        pass

    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4)
    network.blocks[1].attn = MyAttention(32, num_heads=4)
    with pytest.raises(ModelError, match=r"cannot yet reproduce the attention in .*MyAttention exactly"):
        attnviz.wrap(network, "mine", "random", 32)


def test_non_square_and_other_sizes():
    wide = VisionTransformer(img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=4)
    with pytest.raises(ModelError, match="built for 32 × 48 px inputs; attnviz needs a square input"):
        attnviz.wrap(wide, "wide", "random", 32)
    fixed = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4)
    with pytest.raises(ModelError, match=r"built for 32 px inputs, not 48 px; build it with img_size=48 \(or dynamic_img_size=True\)"):
        attnviz.wrap(fixed, "fixed", "random", 48)
    with pytest.raises(ModelError, match="multiple of VisionTransformer's 8 px patches; 36 px is not"):
        attnviz.wrap(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                       dynamic_img_size=True), "dyn", "random", 36)


def test_dynamic_img_size_at_another_size():
    """A dynamic_img_size model wrapped at 48 px gives a 6 × 6 grid; a 32 px tensor is refused."""
    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, dynamic_img_size=True)
    model = attnviz.wrap(network, "dyn", "random", 48)
    cap = capture_tensor(model, torch.randn(1, 3, 48, 48))
    assert cap.grid == (6, 6) and cap.num_tokens == 37
    with pytest.raises(ValueError, match="the input is 32 × 32 px but dyn is set up for 48 × 48 px; load the model with size=32"):
        capture_tensor(model, torch.randn(1, 3, 32, 32))


def test_no_class_token_says_so():
    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                class_token=False, global_pool="avg")
    model = attnviz.wrap(network, "nocls", "random", 32)
    cap = capture_tensor(model, torch.randn(1, 3, 32, 32))
    assert not cap.has_class_token and cap.num_prefix_tokens == 0 and cap.summary == "mean_received"
    with pytest.raises(NoClassTokenError, match=r"this layer has no class-token row \(the model has no class token, or it does not attend here\); use mean_received_map"):
        cap.cls_map(1, 0)
    # the stated alternative: the mean of the patch rows, on the grid
    expected = cap.weights(1, 2).mean(0).reshape(4, 4)
    np.testing.assert_allclose(cap.mean_received_map(1, 2), expected, atol=1e-7)
    np.testing.assert_array_equal(cap.summary_map(1, 2), cap.mean_received_map(1, 2))
    # rollout follows: the mean of the patch rows of R, not patch 0's row
    from attnviz.rollout import capture_layers, rollout_matrix

    joint = rollout_matrix(capture_layers(cap)).numpy()
    np.testing.assert_allclose(rollout_map(cap), joint.mean(0).reshape(4, 4), atol=1e-6)
    assert not np.allclose(rollout_map(cap), joint[0].reshape(4, 4))
    # statistics describe the patch rows' mean, and say so
    stats = attnviz.head_stats(cap)
    assert stats.rows == "patch_mean"
    w = cap.layer_weights(0).double()
    ent = -(w * w.clamp_min(1e-30).log()).sum(-1).mean(-1)  # (H,)
    np.testing.assert_allclose(stats.entropy[0], ent.numpy(), atol=1e-6)


def test_registers_without_class_token_are_not_a_class_token():
    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                class_token=False, reg_tokens=2, global_pool="avg", no_embed_class=True)
    cap = capture_tensor(attnviz.wrap(network, "regs", "random", 32), torch.randn(1, 3, 32, 32))
    assert cap.num_prefix_tokens == 2 and not cap.has_class_token
    with pytest.raises(NoClassTokenError):
        cap.cls_map(0, "mean")


def test_with_class_token_the_summary_is_the_cls_row(tiny):
    cap = capture_tensor(tiny, torch.randn(1, 3, 32, 32))
    assert cap.has_class_token and cap.summary == "cls"
    np.testing.assert_array_equal(cap.summary_map(1, "mean"), cap.cls_map(1, "mean"))


def test_package_names_are_not_shadowed_modules():
    """``from attnviz import rollout`` is the module (the README's Library example)."""
    import types

    from attnviz import masks, relevance, rollout, stats

    for module in (masks, relevance, rollout, stats):
        assert isinstance(module, types.ModuleType)
    assert callable(rollout.rollout_map) and callable(attnviz.rollout_matrix)


def test_relevance_refuses_without_a_class_token_and_for_rope():
    from attnviz.relevance import RelevanceError, relevance_map

    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                class_token=False, global_pool="avg", num_classes=3)
    model = attnviz.wrap(network, "nocls", "random", 32)
    cap = capture_tensor(model, torch.randn(1, 3, 32, 32))
    with pytest.raises(RelevanceError, match="nocls has no class token, and this map is the class token's row of R."):
        relevance_map(model, cap, 0)
    rope = attnviz.wrap(timm.create_model("vit_small_patch16_rope_224", pretrained=False, img_size=32, depth=1,
                                          num_classes=3), "rope", "random", 32)
    with pytest.raises(RelevanceError, match="are not timm's standard ViT block"):
        relevance_map(rope, capture_tensor(rope, torch.randn(1, 3, 32, 32)), 0)


def test_blocks_without_one_attention_module_are_refused():
    from timm.models.vision_transformer import ParallelScalingBlock

    network = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, block_fn=ParallelScalingBlock)
    with pytest.raises(ModelError, match="ParallelScalingBlock blocks have no single attention module attnviz knows"):
        attnviz.wrap(network, "parallel", "random", 32)


def test_every_error_attnviz_raises_shares_one_base():
    """One ``except attnviz.AttnvizError`` catches every error the library raises on bad input."""
    import inspect

    from attnviz import errors, offline, serving

    classes = [c for module in (errors, offline, serving) for _, c in inspect.getmembers(module, inspect.isclass)
               if issubclass(c, Exception) and c.__module__ == module.__name__]
    assert {c.__name__ for c in classes} >= {"ImageError", "ModelError", "RelevanceError", "ExportError", "RunError",
                                             "NoClassTokenError", "HubUnavailable", "WeightsError", "OverBudget"}
    assert all(issubclass(c, attnviz.AttnvizError) for c in classes)
    with pytest.raises(attnviz.AttnvizError, match="PDF document"):
        attnviz.read_photo(b"%PDF-1.4 not a photo", attnviz.load_model(device="cpu"))
