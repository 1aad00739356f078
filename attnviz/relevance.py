"""Class-specific relevance maps (Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability
for Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV).

Raw attention does not depend on which class you ask about. This map does: it weights every
attention weight by how much the class score y_c changes with it. Per layer l, with A_l the
(H, N, N) attention and ∇A_l = ∂y_c / ∂A_l,

    Ā_l = mean over heads of max(∇A_l ⊙ A_l, 0)        # (N, N)
    R ← R + Ā_l · R,   starting from R = I,            # first layer first

and the map is the CLS row of R over the patch tokens.

Gradients need the attention weights inside the autograd graph, which timm's fused (SDPA) path never
materialises. :func:`attention_forward` therefore runs the model's own modules (qkv, q_norm,
k_norm, proj, layer scales, MLP, norms) through an eager re-implementation of timm's ``Block``, without
changing the shared model object in any way; a test checks it equals ``model.network(x)``.
"""
from __future__ import annotations

import numpy as np
import torch
from timm.layers import Attention
from timm.models.vision_transformer import Block

from .capture import Capture, patch_grid
from .models import Model


class RelevanceError(ValueError):
    """Class-specific maps cannot be computed for this model; the message says why, in one sentence."""


def _check(network: torch.nn.Module) -> None:
    blocks = getattr(network, "blocks", None)
    if blocks is None or not len(blocks):
        raise RelevanceError(
            f"{type(network).__name__} is not a timm Vision Transformer; class-specific maps support plain timm ViTs only."
        )
    for block in blocks:
        # Only the exact timm Block / Attention computation is re-implemented below.
        # RoPE (EVA-02, DINOv3) and relative-position blocks are captured exactly (attnviz.adapters),
        # but their gradients would need their own eager re-implementation: refused, not approximated.
        if type(block).forward is not Block.forward or type(block.attn).forward is not Attention.forward:
            raise RelevanceError(
                f"{type(block).__name__} blocks are not timm's standard ViT block; "
                "class-specific maps support plain timm Vision Transformers only."
            )


def _attention_block(block: Block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's ``Block.forward`` in eager arithmetic; returns the block output and its (B, H, N, N) attention."""
    attn = block.attn
    h = block.norm1(x)
    b, n, _ = h.shape
    gate = attn.gate(h).sigmoid() if getattr(attn, "gate", None) is not None else None
    qkv = attn.qkv(h).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each (B, H, N, d_k)
    q, k = attn.q_norm(q), attn.k_norm(k)
    weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, H, N, N)
    out = (weights @ v).transpose(1, 2).reshape(b, n, attn.attn_dim)  # (B, N, H · d_k)
    out = attn.norm(out)
    if gate is not None:
        out = out * gate
    x = x + block.ls1(attn.proj(out))
    x = x + block.ls2(block.mlp(block.norm2(x)))
    return x, weights


def attention_forward(network: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Eval-mode forward of a timm ViT that also returns every layer's (B, H, N, N) attention.

    The attention tensors stay in the autograd graph when ``x`` requires grad. Nothing about
    ``network`` is changed, so it can be shared with other threads.
    """
    _check(network)
    x = network.patch_embed(x)
    x = network._pos_embed(x)
    x = network.patch_drop(x)
    x = network.norm_pre(x)  # (B, N, D)
    attentions = []
    for block in network.blocks:
        x, weights = _attention_block(block, x)
        attentions.append(weights)
    x = network.norm(x)
    return network.forward_head(x), attentions


def relevance_rows(attentions: list[torch.Tensor], gradients: list[torch.Tensor]) -> torch.Tensor:
    """R = Π (I + Ā_l) applied first layer first, with Ā_l = mean_h max(∇A_l ⊙ A_l, 0); (N, N)."""
    n = attentions[0].shape[-1]
    relevance = torch.eye(n, dtype=attentions[0].dtype, device=attentions[0].device)
    for weights, grad in zip(attentions, gradients):
        cam = (grad[0] * weights[0]).clamp(min=0).mean(0)  # (N, N)
        relevance = relevance + cam @ relevance
    return relevance


def class_relevance(model: Model, x: torch.Tensor, class_index: int) -> np.ndarray:
    """(N, N) relevance matrix R of class ``class_index`` for the (1, 3, S, S) input ``x``."""
    _check(model.network)
    if model.labels is None or getattr(model.network, "num_classes", 0) <= 0:
        raise RelevanceError(
            f"{model.name} has no classifier head, so there is no class score to explain."
        )
    if not 0 <= class_index < model.network.num_classes:
        raise RelevanceError(f"class {class_index} is outside 0…{model.network.num_classes - 1}.")
    with torch.inference_mode(False), torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)  # a graph without touching the frozen weights
        logits, attentions = attention_forward(model.network, x)
        gradients = torch.autograd.grad(logits[0, class_index], attentions)
        return relevance_rows([a.detach() for a in attentions], list(gradients)).cpu().numpy()


def relevance_map(model: Model, cap: Capture, class_index: int) -> np.ndarray:
    """(h, w): the class token's row of R over the patches, for the capture's input."""
    if not cap.has_class_token:
        raise RelevanceError(f"{model.name} has no class token, and this map is the class token's row of R.")
    relevance = class_relevance(model, cap.input, class_index)
    return patch_grid(relevance[0], cap.grid, cap.num_prefix_tokens)
