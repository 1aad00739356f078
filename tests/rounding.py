"""Two texts that say the same thing, up to how their numbers were rounded (the GPU walk of tests/test_gpu.py)."""
from __future__ import annotations

import re

NUMBER = re.compile(r"[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def same_but_rounding(a: str, b: str) -> bool:
    """The same words, and numbers equal up to one unit of the last digit shown (the two devices sum in another
    order, so a number may round the other way), or to 1e-4 of their size where more than six decimals are shown;
    error sizes below 1e-6 (e.g. "difference 6.3e-10") all agree."""
    if NUMBER.sub("#", a) != NUMBER.sub("#", b):
        return False
    for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
        u, v = (float(n.replace(",", "").replace("−", "-")) for n in (x, y))
        digits = len(x.split("e")[0].partition(".")[2])
        allowed = 1.01 * 10.0 ** -digits
        if digits > 6:  # a float shown whole (a table of q and k): float32 sums agree to 1e-4 of its size
            allowed = 1e-4 * max(1.0, abs(u), abs(v))
        if x != y and abs(u - v) > allowed and max(abs(u), abs(v)) >= 1e-6:
            return False
    return True
