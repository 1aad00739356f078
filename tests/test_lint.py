"""The whole tree passes Pyflakes' checks (ruff, ``[tool.ruff.lint]`` in pyproject.toml): no name used that is
never defined (two benchmarks read the sample photo through an ``ASSETS`` that the installable layout had
removed, found this way), no import or variable left unused."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT


def test_no_undefined_or_unused_names_anywhere():
    pytest.importorskip("ruff", reason="ruff is in requirements-dev.txt")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "All checks passed" in done.stdout
