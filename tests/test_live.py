"""The live camera's per-frame work and its newest-frame worker, without a browser."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from PIL import Image

import attnviz
from attnviz import render
from attnviz.live import LiveProcessor, LiveSettings, heatmap_frame
from conftest import ASSETS, tiny_vit


def camera_frame(seed: int, size=(160, 120)) -> Image.Image:
    """A 4:3 'camera frame' of random pixels, different for every seed."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def same(x: Image.Image, y: Image.Image) -> bool:
    return np.asarray(x).tobytes() == np.asarray(y).tobytes()


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the live worker did not answer")
        time.sleep(0.005)


@pytest.mark.parametrize("layer, head, fit", [(11, "mean", "crop"), (3, 2, "squash"), (0, "max", "crop")])
def test_frame_equals_capture_on_the_same_picture(real_model, layer, head, fit):
    """The stream's map is exactly what a still capture of the same picture gives (the Freeze promise)."""
    image = Image.open(ASSETS / "coffee.jpg").convert("RGB").resize((320, 240))
    settings = LiveSettings(real_model, layer=layer, head=head, alpha=0.5, cmap="viridis", fit=fit)
    live = heatmap_frame(image, settings)
    cap = attnviz.capture(real_model, image, fit=fit)
    want = cap.cls_map(layer, head)
    assert live.cls_map.shape == (14, 14)
    np.testing.assert_array_equal(live.cls_map, want)
    # and independently of the capture code: the class token's row, recomputed from its queries and keys
    q, k = cap.query[layer, :, 0].double(), cap.key[layer].double()  # (H, d_k), (H, N, d_k)
    rows = ((q[:, None] @ k.transpose(-2, -1))[:, 0] * cap.scale).softmax(-1).numpy()  # (H, N)
    fused = {"mean": rows.mean(0), "max": rows.max(0)}.get(head) if isinstance(head, str) else rows[head]
    np.testing.assert_allclose(live.cls_map, fused[1:].reshape(14, 14), atol=1e-6)
    assert np.asarray(live.view).tobytes() == np.asarray(real_model.view(image, fit)).tobytes()
    overlay = render.overlay(live.view, want, alpha=0.5, cmap="viridis")
    assert np.asarray(live.picture).tobytes() == np.asarray(overlay).tobytes()


def test_display_size_enlarges_without_changing_the_colours(tiny):
    live = heatmap_frame(camera_frame(0), LiveSettings(tiny, layer=1, display=64))
    assert live.picture.size == (64, 64)  # 32 px input, doubled with nearest neighbours
    small = render.overlay(live.view, live.cls_map)
    assert np.array_equal(np.asarray(live.picture)[::2, ::2], np.asarray(small))


def test_newest_frame_wins_and_older_waiting_frames_are_dropped(tiny):
    """While the worker is busy, frames 2 and 3 arrive: 3 replaces 2, which is never computed."""
    busy, release = threading.Event(), threading.Event()
    seen: list[Image.Image] = []

    def slow_encode(picture):
        busy.set()
        release.wait(10)
        return picture

    frames = [camera_frame(i) for i in range(4)]
    proc = LiveProcessor(LiveSettings(tiny, layer=1), encode=slow_encode, workers=1)
    try:
        assert proc.recv(frames[0]) is frames[0]  # nothing computed yet: the camera frame goes back as is
        assert busy.wait(10)  # the worker holds frame 0
        assert proc.recv(frames[1]) is frames[1]
        assert proc.recv(frames[2]) is frames[2]  # replaces frame 1 before the worker took it
        release.set()
        wait_for(lambda: proc.stats().heatmaps == 2)
        seen = [proc.latest.image]
        stats = proc.stats()
        assert (stats.frames_in, stats.heatmaps, stats.dropped) == (3, 2, 1)
        assert same(seen[0], frames[2])
        out = proc.recv(frames[3])  # hands back frame 2's heatmap, the newest finished one
        assert out is not frames[3] and out.size == (32, 32)
    finally:
        release.set()
        proc.stop()


def test_new_settings_apply_to_the_next_frame_without_a_restart(tiny):
    proc = LiveProcessor(LiveSettings(tiny, layer=0, head="mean"))
    try:
        image = camera_frame(7)
        proc.recv(image)
        wait_for(lambda: proc.latest is not None)
        first = proc.latest
        proc.with_settings(layer=1, head=3)  # one new immutable object, swapped in
        proc.recv(image)
        wait_for(lambda: proc.latest is not first)
        cap = attnviz.capture(tiny, image)
        np.testing.assert_array_equal(first.cls_map, cap.cls_map(0, "mean"))
        np.testing.assert_array_equal(proc.latest.cls_map, cap.cls_map(1, 3))
        assert not proc.join(0)  # the workers keep running between frames
    finally:
        proc.stop()
    assert proc.join(5)  # stop() ends them


def test_viewers_sharing_a_model_never_see_each_others_frames():
    """Two streams on one model, each on its own worker thread: every heatmap is its own frame's."""
    model = tiny_vit()
    results: dict[str, list] = {"a": [], "b": []}

    def keep(name):
        def encode(picture):
            live_frames = results[name]
            live_frames.append(picture)
            return picture
        return encode

    procs = {name: LiveProcessor(LiveSettings(model, layer=1, head="mean", alpha=1.0), encode=keep(name))
             for name in results}
    frames = {"a": [camera_frame(100 + i) for i in range(25)], "b": [camera_frame(200 + i) for i in range(25)]}
    try:
        for fa, fb in zip(frames["a"], frames["b"]):
            procs["a"].recv(fa)
            procs["b"].recv(fb)
            time.sleep(0.002)
        for p in procs.values():
            wait_for(lambda p=p: p._pending is None and p.stats().heatmaps > 0)
        for name, proc in procs.items():
            # every computed picture is the overlay of one of this stream's own frames, never the other's
            own = {np.asarray(render.overlay(model.view(f), attnviz.capture(model, f).cls_map(1, "mean"), 1.0)).tobytes()
                   for f in frames[name]}
            assert results[name] and all(np.asarray(p).tobytes() in own for p in results[name])
    finally:
        for p in procs.values():
            p.stop()


def test_ice_servers_parse_json_and_toml_lists():
    live_ui = pytest.importorskip("attnviz_app.live")
    assert live_ui.parse_ice_servers('[{"urls": "stun:10.0.0.1:3478"}]') == [{"urls": "stun:10.0.0.1:3478"}]
    turn = {"urls": ["turn:host:3478"], "username": "u", "credential": "p"}
    assert live_ui.parse_ice_servers([turn]) == [turn]
    assert live_ui.parse_ice_servers(turn) == [turn]
    for bad in ('{"url": "stun:x"}', "[1, 2]", "not json"):
        with pytest.raises(ValueError):
            live_ui.parse_ice_servers(bad)


def test_two_workers_never_go_back_to_an_older_frame(tiny):
    """Frame A is slow and frame B fast on the other worker: when A finishes last, B stays on screen."""
    holding, release = threading.Event(), threading.Event()
    calls = []

    def encode(picture):
        calls.append(picture)
        if len(calls) == 1:  # the first frame's worker is held back
            holding.set()
            release.wait(10)
        return picture

    a, b = camera_frame(1), camera_frame(2)
    proc = LiveProcessor(LiveSettings(tiny, layer=1), encode=encode, workers=2)
    try:
        proc.recv(a)
        assert holding.wait(10)
        proc.recv(b)
        wait_for(lambda: proc.latest is not None)
        assert same(proc.latest.image, b)
        release.set()
        wait_for(lambda: proc.stats().heatmaps == 2)
        assert same(proc.latest.image, b)  # A finished after B but arrived before it
    finally:
        release.set()
        proc.stop()


def test_placeholder_goes_out_until_the_first_heatmap(tiny):
    held = threading.Event()
    proc = LiveProcessor(LiveSettings(tiny, layer=1), encode=lambda p: (held.wait(10), p)[1], placeholder="dark")
    try:
        assert proc.recv(camera_frame(3)) == "dark"  # never the raw camera picture
        held.set()
        wait_for(lambda: proc.latest is not None)
        assert proc.recv(camera_frame(4)).size == (32, 32)
    finally:
        held.set()
        proc.stop()


def test_speed_is_heatmaps_sent_per_second_and_delay_from_arrival_to_sending(tiny):
    now = [0.0]
    proc = LiveProcessor(LiveSettings(tiny, layer=1), clock=lambda: now[0])
    try:
        for k in range(4):  # a frame every 100 ms; each heatmap is ready before the next frame comes
            now[0] = k * 0.1
            proc.recv(camera_frame(k))
            wait_for(lambda k=k: proc.stats().heatmaps == k + 1)
        stats = proc.stats()
        assert np.isnan(LiveProcessor(LiveSettings(tiny, layer=1), workers=0).stats().fps)  # nothing sent yet
        # heatmaps of frames 0, 1, 2 went out with frames 1, 2, 3: at 0.1, 0.2, 0.3 s, 100 ms after arriving
        assert stats.fps == pytest.approx(10.0) and stats.latency_ms == pytest.approx(100.0)
        assert (stats.frames_in, stats.heatmaps, stats.dropped) == (4, 4, 0)
    finally:
        proc.stop()
