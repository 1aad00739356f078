"""Passive OpenMP waiting, set before torch loads its OpenMP runtime (which reads it once, at load).

PyTorch's OpenMP threads spin while they wait for each other. When any other process wants a core, a
team of two spinning threads on a two-core machine collapses: the capture's forward pass took 1.77 s
instead of 0.32 s with passive waiting on the same busy machine (``python -m bench.contention``;
docs/performance.md, "Beside other work"). ``import attnviz`` therefore sets ``OMP_WAIT_POLICY=PASSIVE``
unless the environment already says otherwise or torch was imported first (then it is too late, and
nothing is changed).
"""
from __future__ import annotations

import os
import sys


def passive_waiting() -> bool:
    """Ask for passive OpenMP waiting if torch is not loaded yet; True when the setting is PASSIVE now."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
