"""Class-specific relevance maps (Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability
for Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV).

Raw attention does not depend on which class you ask about. This map does: it weights every
attention weight by how much the class score y_c changes with it. Per layer l, with A_l the
(H, N, N) attention and ∇A_l = ∂y_c / ∂A_l,

    Ā_l = mean over heads of max(∇A_l ⊙ A_l, 0)        # (N, N)
    R ← R + Ā_l · R,   starting from R = I,            # first layer first

and the map is the CLS row of R over the patch tokens.

Gradients need the attention weights inside the autograd graph, which timm's fused (SDPA) path never
materialises. So the model family's adapter runs the network's own modules eagerly
(:meth:`attnviz.adapters.Adapter.attention_forward`; for timm's standard ViT,
:func:`attnviz.adapters.timm_vit.eager_block`), without changing the shared model object in any way;
a test checks it equals ``model.network(x)``. Families without an eager forward refuse.
"""
from __future__ import annotations

import numpy as np
import torch

from .adapters import adapter_for
from .capture import Capture, patch_grid
from .errors import RelevanceError
from .models import Model


def attention_forward(network: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Eval-mode forward of a ViT that also returns every layer's (B, H, N, N) attention.

    The attention tensors stay in the autograd graph when ``x`` requires grad. Nothing about
    ``network`` is changed, so it can be shared with other threads.
    """
    return adapter_for(network, x.shape[-1]).attention_forward(network, x)


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
    if model.labels is None:
        raise RelevanceError(f"{model.public_name} has no classifier head, so there is no class score to explain.")
    if not 0 <= class_index < len(model.labels):
        raise RelevanceError(f"class {class_index} is outside 0…{len(model.labels) - 1}.")
    with torch.inference_mode(False), torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)  # a graph without touching the frozen weights
        logits, attentions = model.adapter.attention_forward(model.network, x)
        gradients = torch.autograd.grad(logits[0, class_index], attentions)
        return relevance_rows([a.detach() for a in attentions], list(gradients)).cpu().numpy()


def relevance_map(model: Model, cap: Capture, class_index: int) -> np.ndarray:
    """(h, w): the class token's row of R over the patches, for the capture's input."""
    if (why := model.adapter.eager_refusal(model.network)) is not None:
        raise RelevanceError(why)
    if not cap.has_class_token:
        raise RelevanceError(f"{model.public_name} has no class token, and this map is the class token's row of R.")
    relevance = class_relevance(model, cap.input, class_index)
    return patch_grid(relevance[0], cap.grid, cap.num_prefix_tokens)
