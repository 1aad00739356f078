"""The model families attnviz reads. Each family module registers its :class:`Family` where it is
defined (timm's ``@register_model`` idiom); this registry only collects them, in registration order."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .base import Adapter


@dataclass(frozen=True)
class Family:
    """One model family: how to recognise its networks, how to read their attention, how to load them.

    A network is the family's when ``recognises(network)`` says so or, for a timm-style network
    (``patch_embed`` and ``blocks``), when every block's ``attn`` is exactly one of ``attention``
    (a subclass may change the logits, so it is not trusted). Families must not claim the same network,
    except a ``fallback`` family, asked last.
    """

    name: str  # e.g. "timm ViT"
    adapter: Callable[[torch.nn.Module, int], Adapter]  # (network, input side S) → Adapter, or a ModelError
    attention: tuple[type, ...] = ()  # the attention classes it reads exactly, in a timm-style network
    recognises: Callable[[torch.nn.Module], bool] | None = None  # for networks of another shape (Hugging Face)
    prefix: str | None = None  # load_model("<prefix><spec>") is loaded by ``load``, e.g. "hf:"
    load: Callable[[str, int | None, torch.device], dict] | None = None  # spec → Model's fields, ``network`` first
    # For a family with a loader: the parameters ``load`` would build, counted without allocating them
    # (the meta device, weight-file headers), for a server's budget; and the files that make up a model.
    parameters: Callable[[str, int | None], int] | None = None  # (spec, size) → parameters
    files: Callable[[str], tuple[Path, ...]] | None = None  # spec → every file whose bytes make it up
    # Asked only after every other family has declined (the generic path, which reads any model's PyTorch
    # attention calls): its adapter also takes the caller's layout, ``grid=`` and ``prefix=``.
    fallback: bool = False

    def __post_init__(self) -> None:
        if (self.prefix is None) != (self.load is None):
            raise ValueError(f"family {self.name!r}: a name prefix and a loader come together")
        if self.load is None and (self.parameters is not None or self.files is not None):
            raise ValueError(f"family {self.name!r}: parameters and files describe what its loader loads")
        if not self.attention and self.recognises is None:
            raise ValueError(f"family {self.name!r} needs attention classes or a recognises function")

    def claims(self, network: torch.nn.Module) -> bool:
        if self.recognises is not None:
            return self.recognises(network)
        classes = attention_classes(network)
        return bool(classes) and classes <= set(self.attention)

    def model_name(self, spec: str) -> str:
        """The name :func:`attnviz.load_model` takes for ``spec``: ``"hf:" + folder``."""
        return f"{self.prefix}{spec}"

    def spec(self, model_name: str) -> str:
        """What follows the prefix in ``model_name``: a folder or repo id for ``"hf:"``."""
        return model_name[len(self.prefix):]


_REGISTERED: dict[str, Family] = {}  # filled once, as family modules are imported; never changed by a run


def register(family: Family) -> Family:
    """Add ``family`` to those :func:`attnviz.adapters.adapter_for` asks (a family module calls this once)."""
    if _REGISTERED.get(family.name, family) is not family:
        raise ValueError(f"two model families are called {family.name!r}")
    _REGISTERED[family.name] = family
    return family


def registered() -> tuple[Family, ...]:
    """Every family registered so far, in registration order, a fallback after all the others."""
    return tuple(sorted(_REGISTERED.values(), key=lambda f: f.fallback))


def attention_classes(network: torch.nn.Module) -> set[type] | None:
    """The classes of a timm-style network's ``blocks[i].attn``; None when it has no patch embedding,
    no blocks, or a block without an ``attn``."""
    blocks = getattr(network, "blocks", None)
    if blocks is None or not len(blocks) or not hasattr(network, "patch_embed"):
        return None
    attentions = [getattr(block, "attn", None) for block in blocks]
    if any(a is None for a in attentions):
        return None
    return {type(a) for a in attentions}
