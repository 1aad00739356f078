"""The peers attnviz is measured against, built on the same offline weights.

Hugging Face transformers' ``Dinov2Model`` is an independent implementation of the same network: the
tests use its eager ``output_attentions=True`` as a second opinion on every weight, and bench/ times it.
"""
from __future__ import annotations

import torch
from safetensors.torch import load_file

from attnviz import offline


def hf_state_dict(timm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm ``vit_small_patch14_dinov2`` names → Hugging Face ``Dinov2Model`` names."""
    dim = timm_state["cls_token"].shape[-1]
    sd = {
        "embeddings.cls_token": timm_state["cls_token"],
        "embeddings.mask_token": torch.zeros(1, dim),
        "embeddings.position_embeddings": timm_state["pos_embed"],
        "embeddings.patch_embeddings.projection.weight": timm_state["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": timm_state["patch_embed.proj.bias"],
        "layernorm.weight": timm_state["norm.weight"],
        "layernorm.bias": timm_state["norm.bias"],
    }
    for i in range(offline.DEPTH):
        t, h = f"blocks.{i}.", f"encoder.layer.{i}."
        # transformers 5 names the projections q_proj / k_proj / v_proj / o_proj
        for part, (w, b) in zip(("q_proj", "k_proj", "v_proj"), zip(
            timm_state[t + "attn.qkv.weight"].chunk(3), timm_state[t + "attn.qkv.bias"].chunk(3)
        )):
            sd[f"{h}attention.{part}.weight"] = w
            sd[f"{h}attention.{part}.bias"] = b
        sd |= {
            h + "norm1.weight": timm_state[t + "norm1.weight"],
            h + "norm1.bias": timm_state[t + "norm1.bias"],
            h + "attention.o_proj.weight": timm_state[t + "attn.proj.weight"],
            h + "attention.o_proj.bias": timm_state[t + "attn.proj.bias"],
            h + "layer_scale1.lambda1": timm_state[t + "ls1.gamma"],
            h + "norm2.weight": timm_state[t + "norm2.weight"],
            h + "norm2.bias": timm_state[t + "norm2.bias"],
            h + "mlp.fc1.weight": timm_state[t + "mlp.fc1.weight"],
            h + "mlp.fc1.bias": timm_state[t + "mlp.fc1.bias"],
            h + "mlp.fc2.weight": timm_state[t + "mlp.fc2.weight"],
            h + "mlp.fc2.bias": timm_state[t + "mlp.fc2.bias"],
            h + "layer_scale2.lambda1": timm_state[t + "ls2.gamma"],
        }
    return sd


def hf_dinov2(attn_implementation: str = "eager") -> torch.nn.Module:
    """Hugging Face ``Dinov2Model`` (ViT-S/14, 518 px position grid) with the offline weights."""
    from transformers import Dinov2Config, Dinov2Model

    config = Dinov2Config(
        hidden_size=384, num_hidden_layers=12, num_attention_heads=6, mlp_ratio=4, image_size=518,
        patch_size=14, layerscale_value=1e-5, attn_implementation=attn_implementation,
    )
    model = Dinov2Model(config)
    model.load_state_dict(hf_state_dict(load_file(offline.converted_weights())), strict=True)
    return model.eval()
