"""A network's class names: timm's ImageNet label info where the network is an ImageNet classifier, else
"class i"; None without a classifier head (a backbone)."""
from __future__ import annotations

import timm.data
import torch


def class_names(network: torch.nn.Module) -> tuple[str, ...] | None:
    if getattr(network, "num_classes", 0) <= 0:
        return None
    subset = timm.data.infer_imagenet_subset(network)
    if subset is None:
        return tuple(f"class {i}" for i in range(network.num_classes))
    info = timm.data.ImageNetInfo(subset)
    return tuple(info.index_to_description(i) for i in range(network.num_classes))
