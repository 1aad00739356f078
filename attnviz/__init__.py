"""attnviz: see what a Vision Transformer attends to.

    >>> from attnviz import load_model, capture
    >>> model = load_model()                      # offline DINOv2-style ViT-S/14 at 196 px
    >>> cap = capture(model, load_photo("cat.jpg", model).image)  # decoded as the page and CLI do
    >>> cap.weights(11, "mean").shape             # (N, N) = (197, 197)
    >>> cap.cls_map(11, 0).shape                  # (h, w) = (14, 14)

Modules (``attnviz.rollout``, ``attnviz.masks``, ``attnviz.stats``, ``attnviz.relevance``) keep their
own names here: no function is exported under a module's name, so ``from attnviz import rollout``
gives the module. The one exception is ``capture``, the function, which shadows the module
``attnviz.capture`` as an attribute (import from the module with ``from attnviz.capture import ...``).
"""
from . import masks, qkmap, relevance, rollout, stats
from ._version import __version__ as __version__
from .capture import Capture, Window, capture, capture_tensor, fuse_heads, patch_grid
from .errors import (
    AttnvizError, ExportError, HubUnavailable, ImageError, IncompleteWeights, LayoutError, ModelError, NoClassTokenError,
    RelevanceError, RunError,
)
from .export import load_capture, save_capture
from .html import show
from .masks import MassMask, draw_mask, mass_mask
from .models import HUB_MODELS, Model, load_model, wrap
from .photos import load_photo, read_photo
from .relevance import attention_forward, class_relevance, relevance_map
from .runtimes import fast
from .rollout import cls_rollout_grid, layer_flow, rollout_map, rollout_matrix, rollout_row
from .stats import HeadStats, head_stats

__all__ = [
    "AttnvizError", "ExportError", "HubUnavailable", "ImageError", "IncompleteWeights", "LayoutError", "RelevanceError", "RunError",
    "Capture", "Window", "capture", "capture_tensor", "fuse_heads", "patch_grid",
    "HUB_MODELS", "Model", "ModelError", "NoClassTokenError", "load_model", "wrap",
    "MassMask", "draw_mask", "mass_mask", "masks",
    "attention_forward", "class_relevance", "relevance_map", "relevance",
    "cls_rollout_grid", "layer_flow", "rollout_map", "rollout_matrix", "rollout_row", "rollout",
    "HeadStats", "head_stats", "stats", "qkmap",
    "load_capture", "save_capture", "show",
    "load_photo", "read_photo",
    "fast",
]
