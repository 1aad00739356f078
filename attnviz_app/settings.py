"""What the sidebar chose: the model, its input size, the fit and the device."""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SIZES = (196, 224, 448, 518)  # the Size box for the offline default; other models: NATIVE, 224, 448
# The photo the page opens on: of the samples, the one whose last-layer map (the Layer slider's first value) lands most
# on its object at 196 px — python -m bench.defaults measures it, docs/classroom.md has the table and the rule.
DEFAULT_PHOTO = "coffee"
NATIVE = 0  # the Size box's "the model's own size": a select box shows None as no choice ("Choose an option")


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

    @property
    def linked(self) -> dict[str, str]:
        """The address's ``model`` (the Model box's value) and ``size`` (``448``, or ``native``), each left out
        where it is what the page opens on (attnviz_app/links.py)."""
        first = DEFAULT_SIZES[0] if self.name is None else None
        return {
            **({"model": self.choice} if self.choice != "default" else {}),
            **({"size": "native" if self.size is None else str(self.size)} if self.size != first else {}),
        }
