"""What every ``attnviz`` command shares: the options that name the model, the model they name, the rule
that no output may be one of the inputs, and how a problem becomes one line on stderr and an exit code.

Exit codes: 2 for options that cannot work (:class:`UsageError`, raised before anything is written), 1 for
an input that cannot be used, 130 after Ctrl-C. Each command says its own sentences; this module only
carries them to stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from . import models
from .errors import AttnvizError, ModelError

FIT_HELP = "non-square photos: crop (default) or squash"


class UsageError(Exception):
    """An option that cannot work; the message is one line for a person."""


def model_arguments(parser: argparse.ArgumentParser, fit_help: str = FIT_HELP, device: bool = True) -> None:
    """Add ``--model``, ``--checkpoint``, ``--size``, ``--fit`` and (with ``device``) ``--device`` to ``parser``."""
    parser.add_argument("--model", default=None,
                        help="timm model name, hf:<folder>, or module:callable, a Python function that builds the "
                             "network (default: the offline ViT-S/14)")
    parser.add_argument("--checkpoint", default=None, help="local .safetensors file for --model's architecture")
    parser.add_argument("--size", type=int, default=None, help="input size in pixels (default 196 for the offline model)")
    parser.add_argument("--fit", choices=("crop", "squash"), default="crop", help=fit_help)
    if device:
        parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")


def check_device(device: str | None) -> str | None:
    """``--device`` as torch will take it, or a one-line reason it cannot work here."""
    import torch

    if device is None:
        return None
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device must be cpu or cuda (or cuda:N), not {device!r}.") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(
                f"--device {device} asks for a GPU, but PyTorch sees none on this machine; use --device cpu.")
        if parsed.index is not None and parsed.index >= count:
            raise UsageError(f"--device {device} asks for GPU {parsed.index}, but PyTorch sees only {count}.")
    elif parsed.type != "cpu":
        raise UsageError(f"--device must be cpu or cuda (or cuda:N), not {device!r}.")
    return device


def load_model_from(args: argparse.Namespace, consequence: str = "") -> models.Model:
    """The model that :func:`model_arguments`' options in ``args`` name; one that cannot load is a
    :class:`UsageError`, the model's sentence followed by ``consequence`` (e.g. "Nothing was written.")."""
    check_device(getattr(args, "device", None))
    try:
        return models.load_model(args.model, args.size, checkpoint=args.checkpoint, device=getattr(args, "device", None))
    except ModelError as e:
        raise UsageError(f"{e} {consequence}" if consequence else str(e)) from None


def identities(path: str | Path) -> set[tuple]:
    """Every way ``path`` can name the same file as another path: the file it resolves to (after symbolic
    links), the directory entry itself (a link is an entry too), and, when it exists, its inode (hard
    links, case-insensitive file systems)."""
    path = Path(path)
    entry = Path(os.path.realpath(path.parent)) / path.name
    ids: set[tuple] = {("path", os.path.realpath(path)), ("path", str(entry))}
    try:
        st = path.stat()
        ids.add(("inode", st.st_dev, st.st_ino))
    except (OSError, ValueError):
        pass
    return ids


def reads(args: argparse.Namespace, *inputs: str | Path | None) -> list[str | Path | None]:
    """Every file or folder a command reads: ``inputs`` (its photos, video, run) and the files of the model
    that :func:`model_arguments`' options in ``args`` name (:func:`attnviz.models.model_files`: the checkpoint,
    a Hugging Face folder's files, a builder's source, the cached weights)."""
    return [*inputs, *models.model_files(args.model, args.checkpoint)]


def check_outputs(outputs: Iterable[tuple[str, str | Path]], inputs: Iterable[str | Path | None],
                  consequence: str = "nothing was written, so name another file") -> None:
    """Refuse, before anything is written, an output that is one of the inputs — the same file by name,
    through a symbolic link (an output link or an input link), as a hard link — or a file inside an input
    folder (a dataset run's own files: ``run.json``, its tables, its stored captures).

    ``outputs`` are (what it is for a reader, e.g. ``"--json out.json"``, path); ``inputs`` every file or
    folder the command reads (None is skipped: an option not given), as :func:`reads` lists them with the
    model's own files. The sentence ends with ``consequence``. Every command that writes files calls this:
    export, figure, faithfulness, qk and video.
    """
    taken: dict[tuple, str] = {}
    folders: list[tuple[str, str]] = []
    for name in inputs:
        if name is None:
            continue
        for identity in identities(name):
            taken.setdefault(identity, str(name))
        if Path(name).is_dir():
            folders.append((str(name), os.path.realpath(name)))
    for what, target in outputs:
        target = Path(target)
        clash = next((taken[i] for i in identities(target) if i in taken), None)
        if clash is not None:
            raise UsageError(f"{what} would overwrite the input {clash} ({target}); {consequence}.")
        entry = os.path.join(os.path.realpath(target.parent), target.name)
        for name, folder in folders:
            if os.path.commonpath([entry, folder]) == folder:
                raise UsageError(f"{what} is inside the folder {name}, whose files this command reads; {consequence}.")


def say(error: object, code: int) -> int:
    """Write ``error`` as one line ``error: …`` on stderr; ``code`` is the exit code to return."""
    print(f"error: {error}", file=sys.stderr)
    return code


def run_command(run: Callable[[argparse.Namespace], int], args: argparse.Namespace, interrupted: str) -> int:
    """``run(args)``'s exit code; a :class:`UsageError` or :class:`attnviz.AttnvizError` it raises is one line and
    exit code 2, and Ctrl-C
    that ``run`` does not answer itself (while the model loads) is the line ``interrupted`` and exit code 130."""
    try:
        return run(args)
    except (UsageError, AttnvizError) as e:  # what a model or photo cannot do: one line, never a traceback
        return say(e, 2)
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return 130
