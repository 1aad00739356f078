"""bench.machine: the line every benchmark prints about the computer it ran on."""
import pytest
import torch

from bench import machine

ZEN5 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9R45
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16
"""
AVX2_ONLY = ZEN5.replace(" avx512f avx512bw avx512_bf16", "").replace("9R45", "7B13").replace(": 26", ": 25")


def test_the_cpu_line_names_the_model_and_the_widest_vectors():
    assert machine.cpu_model(ZEN5) == "AMD EPYC 9R45, family 26 model 2"
    assert machine.vector_width(ZEN5) == "AVX-512"
    assert machine.cpu_model(AVX2_ONLY) == "AMD EPYC 7B13, family 25 model 2"
    assert machine.vector_width(AVX2_ONLY) == "AVX2 + FMA, no AVX-512"
    assert machine.vector_width("flags : fpu sse2 avx\n") == "no AVX2"
    assert (machine.cpu_model(""), machine.vector_width("")) == ("unknown CPU", "unknown vector instructions")


@pytest.mark.serial  # measures the machine: runs alone (make test's serial pass)
def test_the_matmul_rate_is_measured_on_one_core_and_leaves_the_thread_count_as_it_was():
    before = torch.get_num_threads()
    rate = machine.matmul_gflops(repeats=3)
    assert 1 < rate < 2000  # GFLOP/s of one core: a real measurement, not a constant or a time in seconds
    assert torch.get_num_threads() == before
