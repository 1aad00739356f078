"""The zoo walk (issue #22): every timm vision-transformer family is read exactly (≤ 1e-5 against its
own eager softmax, every layer and head, attention peaked) or refused in one true sentence; none crashes.

The fast tests build a few families small; ``--slow`` walks the smallest two members of every family
in :data:`tests.zoo.FAMILIES` at their own input size (a few minutes on two cores).
"""
from __future__ import annotations

import pytest

from tests.zoo import FAMILIES, TOLERANCE, members, one_sentence, walk_one


def check(result) -> None:
    has_attention = FAMILIES[result.module][1]
    if result.status == "exact":
        assert result.worst <= TOLERANCE, f"{result.name}: off by {result.worst:.2e}"
        return
    sentence = result.detail
    assert one_sentence(sentence), sentence
    if has_attention:  # a vision transformer is never "not a Vision Transformer"
        assert "not a Vision Transformer" not in sentence, sentence
    else:
        assert "has no attention between patches" in sentence, sentence


# ---- fast: small builds of a few families --------------------------------------------------------

@pytest.mark.parametrize("module, name, kwargs, size", [
    ("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224", {"depth": 2}, 224),
    ("vitamin", "vitamin_small_224", {"depth": 2}, 224),
    ("beit", "beit_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
    ("beit", "beitv2_base_patch16_224", {"depth": 2, "img_size": 64, "embed_dim": 64, "num_heads": 4}, 64),
])
def test_small_members_are_exact_when_peaked(module, name, kwargs, size):
    result = walk_one(module, name, kwargs, size)
    assert result.status == "exact", result.detail
    check(result)
    assert result.peak > 0.5  # peaked for real: some head puts over half its weight on one key


@pytest.mark.parametrize("module, name, kwargs, sentence", [
    ("convnext", "convnext_zepto_rms", {}, "ConvNeXt has no attention between patches (it mixes them with "
     "convolutions), so there are no attention weights to show."),
    ("swiftformer", "swiftformer_xs", {}, "SwiftFormer has no attention between patches (it mixes them with "
     "additive attention, which has no softmax between tokens), so there are no attention weights to show."),
    ("cait", "cait_xxs24_224", {"depth": 2, "depth_token_only": 1}, "Cait has talking-heads attention (the heads "
     "are mixed before and after the softmax), which attnviz cannot reproduce exactly yet, so it refuses it "
     "rather than show attention weights that may be wrong."),
    ("fastvit", "fastvit_t8", {}, "FastVit has no attention between patches (it mixes them with RepMixer "
     "convolutions), so there are no attention weights to show."),
])
def test_refusals_name_what_the_model_has(module, name, kwargs, sentence):
    result = walk_one(module, name, kwargs, 224)
    assert result.status == "refused"
    assert result.detail == sentence
    check(result)


# ---- slow: the smallest two members of every family ----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("module", list(FAMILIES))
def test_zoo_walk(module):
    for name in members(module):
        check(walk_one(module, name))
