"""Models built by a Python callable: ``load_model("py:my_package.vits:build")`` (or ``"my_package.vits:build"``,
the CLI's ``--model my_package.vits:build``).

The callable takes no arguments and returns the ``torch.nn.Module``; its weights are whatever it gives them (it may
load its own file). The network is then read like any other: by its family's adapter when it is a timm or supported
Hugging Face model, otherwise through its PyTorch attention calls (:mod:`.generic`). The input size is the one asked
for, else the one the network says it was built for (``patch_embed.img_size``, ``image_size``,
``config.image_size``); preprocessing is timm's defaults for the network (ImageNet mean and standard deviation
unless it has a timm ``pretrained_cfg``), which the page says beside the photo.

A server's owner lists builders in the checkpoints folder as ``<label>.builder`` files holding the one line
``module:callable`` (:mod:`attnviz.serving`): the code is the owner's, named at start; a visitor only picks it.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import torch

from ..errors import ModelError
from ..labels import class_names
from .registry import Family, register

PREFIX = "py:"
SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # module:callable


def is_spec(name: str | None) -> bool:
    """Whether ``name`` is ``module:callable`` (timm names and Hugging Face repo ids never hold a colon)."""
    return bool(name) and SPEC.fullmatch(name) is not None


def builder(spec: str):
    """The callable ``spec`` (``module:callable``) names, or one sentence."""
    if not is_spec(spec):
        raise ModelError(f"{spec!r:.80} is not a Python builder: give module:callable, e.g. my_package.vits:build.")
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module's own error while it runs
        raise ModelError(f"Could not import {module_name} for the builder {spec}: {type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0][:160]}.") from e
    build = getattr(module, attribute, None)
    if not callable(build):
        raise ModelError(f"{module_name} has no callable {attribute}, so {spec} builds no model.")
    return build


def build(spec: str) -> torch.nn.Module:
    try:
        network = builder(spec)()
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"{spec}() failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}.") from e
    if not isinstance(network, torch.nn.Module):
        raise ModelError(f"{spec}() returned {type(network).__name__}, not a torch.nn.Module.")
    return network


def native_size(network: torch.nn.Module) -> int | None:
    """The square input side the network says it was built for, or None."""
    for value in (getattr(getattr(network, "patch_embed", None), "img_size", None), getattr(network, "image_size", None),
                  getattr(getattr(network, "config", None), "image_size", None)):
        if isinstance(value, (tuple, list)) and value:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def load(spec: str, size: int | None, device: torch.device) -> dict:
    """Everything :class:`attnviz.Model` needs from the builder ``spec``."""
    import timm.data

    network = build(spec)
    size = native_size(network) if size is None else size
    if size is None:
        raise ModelError(f"{spec} does not say which input size it was built for; pass size= (the CLI's --size).")
    cfg = timm.data.resolve_data_config({}, model=network)
    cfg["input_size"] = (3, size, size)
    notes, note_keys = (), ()
    if getattr(network, "pretrained_cfg", None) is None:
        notes = (f"{spec} does not say how its photos are normalised, so attnviz uses ImageNet's mean and standard "
                 "deviation; if it was trained with other values, its attention here is not what it computes on its own "
                 "inputs.",)
        note_keys = (("no_normalisation", {"name": spec}),)
    return dict(network=network, name=f"{PREFIX}{spec}", public_name=spec, provenance=f"Python builder {spec}",
                size=size, data_config=cfg, labels=class_names(network), notes=notes, note_keys=note_keys)


def parameters(spec: str, size: int | None) -> int:
    """Parameters the builder makes, built on the meta device (no memory, no weights read)."""
    from ..weightfiles import skip_meta_init

    with torch.device("meta"), skip_meta_init():
        network = build(spec)
    return sum(p.numel() for p in network.parameters())


def files(spec: str) -> tuple[Path, ...]:
    """The builder's source file: what its content key is made of."""
    module_name = spec.partition(":")[0]
    found = importlib.util.find_spec(module_name)
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise ModelError(f"{module_name} has no source file to read, so {spec} cannot be identified by its content.")
    return (Path(found.origin),)


def never(network: torch.nn.Module) -> bool:
    """A builder's network is read by whichever family claims it, never by this one."""
    return False


FAMILY = register(Family("Python builder", lambda network, size: None, recognises=never, prefix=PREFIX, load=load,
                         parameters=parameters, files=files))
