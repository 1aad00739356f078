"""Files written whole or not at all: a temporary file beside the target, then one atomic rename.

Every file attnviz writes (an export's .npz, the overlay PNG, the HTML page, the layer sweep GIF) goes
through :func:`replacing`. A write that fails or is interrupted (Ctrl-C, a full disk) removes its
temporary file and leaves the target as it was: never half a file under the target's name. The
temporary file lives in the target's own folder, so the rename never crosses file systems, and it is
created as a plain ``open(path, "wb")`` would create it (mode 0o666 less the umask).

A target that is a symbolic link is replaced by the new file; the file the link pointed to is left
alone, so writing an output can never reach through a link into another file.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Iterator

PARTIAL = ".part"  # suffix of the temporary files: .<name>.<random>.part


def _partial(path: Path) -> tuple[Path, int]:
    """A new, empty temporary file beside ``path`` and its descriptor (exclusive create: never an old file)."""
    while True:
        # the name is cut so that a long target name does not make the temporary one too long to create
        partial = path.with_name(f".{path.name[:64]}.{secrets.token_hex(4)}{PARTIAL}")
        try:
            return partial, os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file for ``path``'s new content; it becomes ``path`` only when the block ends without error."""
    path = Path(path)
    partial, fd = _partial(path)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_bytes(path: str | Path, data: bytes) -> Path:
    """``Path(path).write_bytes(data)``, atomically."""
    with replacing(path) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """``Path(path).write_text(text)``, atomically (no newline translation: the text is written as it is)."""
    return write_bytes(path, text.encode(encoding))
