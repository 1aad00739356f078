"""The machine a benchmark ran on, in one line: its CPU, its widest vector instructions, and how fast one of
its cores multiplies float32 matrices at the moment of the run.

The same "2-core machine" has been more than one kind of host: on December 3 a Zen 5 with AVX-512 ran the
capture's forward in 65–75 ms, and a Zen 3 without AVX-512 in 128–170 ms. A table read without this
line compares numbers from different computers.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

SIDE = 1024  # a (1024 × 1024) @ (1024 × 1024) float32 product: 2.1 GFLOP, long enough to time, short enough to repeat


def cpuinfo() -> str:
    """Linux's /proc/cpuinfo, or "" elsewhere."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def field(info: str, name: str) -> str | None:
    """The first value of ``name`` in a /proc/cpuinfo text."""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_model(info: str) -> str:
    """The CPU's name as the kernel reports it, with its family and model numbers (a virtual machine's name
    is often only the maker's: "AMD EPYC"), or "unknown CPU"."""
    name = field(info, "model name") or "unknown CPU"
    family, model = field(info, "cpu family"), field(info, "model")
    return f"{name}, family {family} model {model}" if family and model else name


def vector_width(info: str) -> str:
    """The widest float32 vector instructions the CPU offers."""
    flags = field(info, "flags")
    if flags is None:
        return "unknown vector instructions"
    flags = set(flags.split())
    if "avx512f" in flags:
        return "AVX-512"
    if {"avx2", "fma"} <= flags:
        return "AVX2 + FMA, no AVX-512"
    return "no AVX2"


def matmul_gflops(repeats: int = 9) -> float:
    """float32 GFLOP/s of one core on a 1024² matrix product now (median of ``repeats``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(SIDE, SIDE), torch.randn(SIDE, SIDE)
        for _ in range(2):
            a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2 * SIDE**3 / statistics.median(times) / 1e9


def describe() -> str:
    """E.g. "AMD EPYC, family 25 model 1 (AVX2 + FMA, no AVX-512); one core multiplies float32 matrices at
    94 GFLOP/s now"."""
    info = cpuinfo()
    rate = matmul_gflops()
    return f"{cpu_model(info)} ({vector_width(info)}); one core multiplies float32 matrices at {rate:.0f} GFLOP/s now"
