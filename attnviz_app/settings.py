"""What the sidebar chose: the model, its input size, the fit and the device."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    name: str | None  # None: the offline default; a timm name; "hf:<folder>"; the architecture of a checkpoint
    size: int | None
    checkpoint: str | None  # the owner's .safetensors file (a server path, never typed by a visitor)
    device: str
    fit: str
    content: str | None = None  # sha256 of the checkpoint's files, when there is one
    choice: str = "default"  # the Model box's value
    label: str = ""  # the Model box's label for it

    @property
    def key(self) -> tuple:
        return (self.name, self.size, self.checkpoint, self.content, self.device)
