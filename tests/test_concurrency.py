"""Many sessions share one model object: concurrent captures must equal one-by-one captures, bit for bit."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from PIL import Image

import attnviz

from make_corpus import photo, quadrants

from conftest import ASSETS, Q, K

pytestmark = pytest.mark.serial  # sixteen threads at once, on the real model: runs alone, after make test's parallel pass
THREADS = 16


def sixteen_photos() -> list[Image.Image]:
    """Four real photos, eleven synthetic ones of different sizes and content, one tiny quadrant picture."""
    real = [Image.open(ASSETS / f).convert("RGB") for f in ("cat.jpg", "coffee.jpg", "astronaut.jpg", "rocket.jpg")]
    made = [photo(160 + 37 * i, 120 + 23 * i, seed=i) for i in range(11)]
    pictures = [*real, *made, quadrants(9, 7)]
    assert len(pictures) == THREADS
    return pictures


def hooks_on(network: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in network.modules())


def installed(model: attnviz.Model) -> int:
    """The hooks wrap() installs, once: q, k, the residual stream and the head switch (at the output
    projection, attnviz.adapters.Tap.heads_off) of every layer."""
    return 4 * model.depth


def concurrently(model: attnviz.Model, pictures: list[Image.Image]) -> list[attnviz.Capture]:
    start = threading.Barrier(len(pictures))  # all threads enter the forward pass together

    def one(picture: Image.Image) -> attnviz.Capture:
        start.wait(timeout=60)
        return attnviz.capture(model, picture)

    with ThreadPoolExecutor(len(pictures)) as pool:
        return list(pool.map(one, pictures))


def assert_same(a: attnviz.Capture, b: attnviz.Capture) -> None:
    assert torch.equal(a.input, b.input)
    assert torch.equal(Q(a), Q(b))  # every layer's and head's queries (L, H, N, d_k)
    assert torch.equal(K(a), K(b))
    assert torch.equal(a.output, b.output)


def one_at_a_time(model: attnviz.Model, pictures: list[Image.Image]) -> list[attnviz.Capture]:
    """Each capture alone, on a thread of its own, as the concurrent ones run: PyTorch gives every new thread
    the process's intra-op thread count (a page run in this process may have set it to the server's one),
    while the main thread keeps the count it started with, and another count may sum in another order."""
    out: list[attnviz.Capture] = []
    for picture in pictures:
        alone = threading.Thread(target=lambda p=picture: out.append(attnviz.capture(model, p)))
        alone.start()
        alone.join()
    return out


@pytest.fixture(scope="module")
def real_runs(real_model):
    """The sixteen photos captured one by one, then all at once in sixteen threads."""
    pictures = sixteen_photos()
    one_by_one = one_at_a_time(real_model, pictures)
    return one_by_one, concurrently(real_model, pictures)


def test_sixteen_threads_equal_one_by_one_on_the_real_model(real_model, real_runs):
    one_by_one, together = real_runs
    # The photos really differ, so a capture swapped between threads could not go unnoticed.
    assert all(not torch.equal(Q(one_by_one[0]), Q(c)) for c in one_by_one[1:])
    for alone, shared in zip(one_by_one, together):
        assert_same(alone, shared)
    assert hooks_on(real_model.network) == installed(real_model)


def test_weights_from_concurrent_captures_equal_one_by_one(real_runs):
    for alone, shared in zip(*real_runs):
        for layer in (0, 11):
            assert torch.equal(alone.layer_weights(layer), shared.layer_weights(layer))


def test_tiny_model_many_rounds_no_crossing(tiny):
    pictures = [photo(40 + i, 30 + 2 * i, seed=100 + i) for i in range(THREADS)]
    one_by_one = one_at_a_time(tiny, pictures)
    for _ in range(3):
        for alone, shared in zip(one_by_one, concurrently(tiny, pictures)):
            assert_same(alone, shared)
    assert hooks_on(tiny.network) == installed(tiny)


def test_a_failed_forward_pass_leaves_no_capture_running(tiny, monkeypatch):
    def out_of_memory(x):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(tiny.network.blocks[1], "forward", out_of_memory)  # fails inside the model, mid-way
    with pytest.raises(RuntimeError, match="out of memory"):
        attnviz.capture_tensor(tiny, torch.zeros(1, 3, 32, 32))
    monkeypatch.undo()
    assert tiny.tap.current is None and hooks_on(tiny.network) == installed(tiny)
    attnviz.capture(tiny, photo(32, 32))  # and the model still works afterwards
    assert tiny.tap.current is None and hooks_on(tiny.network) == installed(tiny)


def test_hooks_are_installed_once_per_network(tiny):
    assert hooks_on(tiny.network) == installed(tiny) == 8
    again = attnviz.wrap(tiny.network, "again", "the same network", 32)
    assert again.tap is tiny.tap and hooks_on(tiny.network) == 8  # wrapped twice, hooked once


def test_a_deep_copy_has_hooks_of_its_own(tiny):
    """copy.deepcopy(network) copies the hooks too; the copy's write into the copy's captures only."""
    import copy

    twin = attnviz.wrap(copy.deepcopy(tiny.network), "twin", "a deep copy", 32)
    assert twin.tap is not tiny.tap and hooks_on(twin.network) == installed(twin)
    x, other = torch.randn(1, 3, 32, 32), torch.randn(1, 3, 32, 32)
    alone = attnviz.capture_tensor(tiny, x)

    def copy_runs_too(_module, _inputs, _output) -> None:
        twin.network(other)  # on this thread, in the middle of the original's capture

    handle = tiny.network.blocks[0].register_forward_hook(copy_runs_too)
    try:
        during = attnviz.capture_tensor(tiny, x)
    finally:
        handle.remove()
    assert_same(alone, during)
    assert_same(attnviz.capture_tensor(twin, x), alone)  # and the copy captures what the original does


def test_other_threads_forward_passes_are_not_recorded(tiny):
    """A plain forward pass of the shared network on another thread, mid-capture, leaves the capture alone."""
    x, other = torch.randn(1, 3, 32, 32), torch.randn(1, 3, 32, 32)
    alone = attnviz.capture_tensor(tiny, x)
    inside = threading.Event()

    def meanwhile(_module, _inputs, _output) -> None:
        if not inside.is_set():
            inside.set()
            worker = threading.Thread(target=lambda: tiny.network(other))
            worker.start()
            worker.join()

    handle = tiny.network.blocks[0].register_forward_hook(meanwhile)
    try:
        during = attnviz.capture_tensor(tiny, x)
    finally:
        handle.remove()
    assert inside.is_set()
    assert_same(alone, during)
