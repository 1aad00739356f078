"""attnviz: see what a Vision Transformer attends to.

    >>> from attnviz import load_model, capture
    >>> model = load_model()                      # offline DINOv2-style ViT-S/14 at 196 px
    >>> cap = capture(model, load_photo("cat.jpg", model).image)  # decoded as the page and CLI do
    >>> cap.weights(11, "mean").shape             # (N, N) = (197, 197)
    >>> cap.cls_map(11, 0).shape                  # (h, w) = (14, 14)
"""
from .capture import Capture, capture, capture_tensor, fuse_heads, patch_grid
from .masks import MassMask, draw_mask, mass_mask
from .models import HUB_MODELS, Model, ModelError, load_model, wrap
from .photos import load_photo, read_photo
from .relevance import RelevanceError, attention_forward, class_relevance, relevance_map
from .rollout import cls_rollout_grid, layer_flow, rollout, rollout_map, rollout_row
from .stats import HeadStats, head_stats

__all__ = [
    "Capture", "capture", "capture_tensor", "fuse_heads", "patch_grid",
    "HUB_MODELS", "Model", "ModelError", "load_model", "wrap",
    "MassMask", "draw_mask", "mass_mask",
    "RelevanceError", "attention_forward", "class_relevance", "relevance_map",
    "cls_rollout_grid", "layer_flow", "rollout", "rollout_map", "rollout_row",
    "HeadStats", "head_stats",
    "load_photo", "read_photo",
]
