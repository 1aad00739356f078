"""How a photo became the model's input, kept with the capture so it can be shown and exported alone.

The picture itself is not stored twice: :meth:`Preparation.picture` recovers the S × S view from the
exact input tensor by undoing the normalisation, x · std + mean, to the same 8-bit pixels.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image


@dataclass(frozen=True)
class Preparation:
    model: str  # the model's public name (Model.public_name: no path on the computer that made it)
    size: int  # input side S in pixels
    fit: str | None  # "crop" (resize + centre crop) or "squash"; None when a tensor was passed in directly
    crop_pct: float  # resize the shorter side to S / crop_pct, then crop S × S (fit "crop" only)
    interpolation: str  # resize filter for fit "crop"; "squash" always resizes bicubic
    mean: tuple[float, float, float]  # per-channel normalisation: (x − mean) / std
    std: tuple[float, float, float]

    def picture(self, x: torch.Tensor) -> Image.Image:
        """The S × S RGB picture the (1, 3, S, S) normalised tensor ``x`` was made from."""
        mean = torch.tensor(self.mean, dtype=torch.float64).view(3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float64).view(3, 1, 1)
        unit = x[0].detach().cpu().double() * std + mean  # (3, S, S) in [0, 1]
        pixels = (unit * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
        return Image.fromarray(np.ascontiguousarray(pixels))


def preparation(model, fit: str | None) -> Preparation:
    """What ``model.view`` and ``model.to_input`` do to a photo, as plain values."""
    cfg = model.data_config
    return Preparation(
        model=model.public_name,
        size=model.size,
        fit=fit,
        crop_pct=float(cfg.get("crop_pct", 1.0)),
        interpolation=str(cfg.get("interpolation", "bicubic")),
        mean=tuple(float(v) for v in cfg["mean"]),
        std=tuple(float(v) for v in cfg["std"]),
    )
