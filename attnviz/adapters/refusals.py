"""What the vision transformers attnviz does not read have instead, in one true sentence each.

A network no registered family claims is refused (:func:`attnviz.adapters.refusal`). When its
architecture is one of timm's families below, the sentence names what that family has — attention
attnviz cannot reproduce exactly yet, or no softmax between tokens at all — rather than call a
vision transformer "not a Vision Transformer". Keys are the module that defines the network's
class (``type(network).__module__``); a family whose members differ (FastViT, MetaFormer, MobileViT)
gives one phrase for members with attention and one for those without.

A family that gains an adapter leaves this table: its adapter claims the network first.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Missing:
    """What a family has: ``attention`` when it has softmax attention attnviz cannot reproduce exactly yet,
    ``without`` (for members with no attention module) or ``mixing`` (the whole family) when it has no
    softmax between tokens."""

    attention: str | None = None  # e.g. "talking-heads attention …"
    mixing: str | None = None  # e.g. "convolutions": no attention between patches at all
    without: str | None = None  # for members without an attention module, when some members have one


TIMM = "timm.models."
FAMILIES: dict[str, Missing] = {
    TIMM + "fastvit": Missing("attention in its last stage only, after RepMixer convolution stages",
                              without="RepMixer convolutions"),
    TIMM + "metaformer": Missing("attention stages after convolutional ones", without="pooling or convolutions"),
    TIMM + "byobnet": Missing("transformer blocks over unfolded pixels inside convolution stages (MobileViT)",
                              without="convolutions"),
    TIMM + "efficientvit_mit": Missing(mixing="ReLU linear attention, which has no softmax between tokens"),
    TIMM + "swiftformer": Missing(mixing="additive attention, which has no softmax between tokens"),
    # CoaT's factorized attention: softmax(K) over the tokens, then q · (softmax(K)ᵀ V), a channels × channels
    # product: no query ever gets a weight on another token (Xu et al. 2021, eq. 2)
    TIMM + "coat": Missing(mixing="factorized attention, a softmax of the keys over the tokens applied to the "
                                  "channels, which gives no weight between two tokens"),
    TIMM + "convnext": Missing(mixing="convolutions"),
    TIMM + "focalnet": Missing(mixing="focal modulation"),
    TIMM + "mambaout": Missing(mixing="gated convolutions"),
    TIMM + "mlp_mixer": Missing(mixing="MLPs across tokens"),
    TIMM + "sequencer": Missing(mixing="LSTMs across rows and columns"),
    TIMM + "edgenext": Missing(mixing="transposed attention across channels and convolutions"),
}


def has_attention_module(network: torch.nn.Module) -> bool:
    """Whether any submodule is an attention layer by its class name (``…Attention``, ``…Attn``)."""
    return any("attention" in type(m).__name__.lower() or type(m).__name__.endswith("Attn")
               for m in network.modules())


def known_refusal(network: torch.nn.Module) -> str | None:
    """The sentence for a network of a family in :data:`FAMILIES`, or None."""
    net = type(network).__name__
    missing = FAMILIES.get(type(network).__module__)
    if missing is None:
        return None
    mixing = missing.mixing
    if mixing is None and missing.without is not None and not has_attention_module(network):
        mixing = missing.without
    if mixing is not None:
        return (f"{net} has no attention between patches (it mixes them with {mixing}), "
                "so there are no attention weights to show.")
    return (f"{net} has {missing.attention}, which attnviz cannot reproduce exactly yet, so it refuses it "
            "rather than show attention weights that may be wrong.")
