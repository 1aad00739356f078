"""The live camera's per-frame work and its newest-frame worker, without a browser."""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

import attnviz
from attnviz import render, serving
from attnviz.jobs import core_count
from attnviz.live import LiveProcessor, LiveSettings, heatmap_frame
from attnviz.live_sharing import Priority, StreamSlots
from conftest import ASSETS, tiny_vit, Q, K, SCALE

pytestmark = pytest.mark.serial  # live frames against page work on the cores, timed: runs alone, after make test's parallel pass


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
    q, k = Q(cap)[layer, :, 0].double(), K(cap)[layer].double()  # (H, d_k), (H, N, d_k)
    rows = ((q[:, None] @ k.transpose(-2, -1))[:, 0] * SCALE(cap)).softmax(-1).numpy()  # (H, N)
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


def idle_stream(tiny, clock=time.monotonic) -> LiveProcessor:
    """A stream that computes nothing (no worker): enough to hold a slot."""
    return LiveProcessor(LiveSettings(tiny, layer=1), workers=0, clock=clock)


def test_slots_cap_streams_and_a_stopped_stream_frees_its_slot(tiny):
    slots = StreamSlots(2)
    made = []

    def make():
        made.append(idle_stream(tiny))
        return made[-1]

    a, b = slots.open("visitor a", make), slots.open("visitor b", make)
    assert a is made[0] and b is made[1] and slots.free() == 0
    assert slots.open("visitor c", make) is None and len(made) == 2  # over the cap: nothing is even made
    assert slots.holds(a) and slots.holds(b) and not slots.holds(idle_stream(tiny))
    a.stop()  # the stream ended (Stop pressed, Freeze, the connection closed)
    assert slots.free() == 1 and not slots.holds(a)
    c = slots.open("visitor c", make)
    assert c is made[2] and slots.holds(c) and slots.free() == 0
    assert StreamSlots(0).open("anyone", make) is None and len(made) == 3  # 0: no live camera at all


def test_slots_are_taken_back_from_a_closed_tab_and_a_silent_camera(tiny):
    connected = {"a", "b"}
    now = [0.0]
    slots = StreamSlots(2, alive=lambda owner: owner in connected, idle_s=5.0, gone_s=2.0, clock=lambda: now[0])
    a = slots.open("a", lambda: idle_stream(tiny, clock=lambda: now[0]))
    b = slots.open("b", lambda: idle_stream(tiny, clock=lambda: now[0]))
    connected.discard("b")  # b's connection drops …
    assert slots.free() == 0 and slots.holds(b)
    now[0] = 1.5
    connected.add("b")  # … and comes back within 2 s: b keeps its stream
    assert slots.free() == 0 and slots.holds(b) and not b.stopped
    connected.discard("a")  # a's browser tab went away
    assert slots.free() == 0 and slots.holds(a)  # not yet: it may come back
    a.recv(camera_frame(0))
    b.recv(camera_frame(0))
    now[0] = 3.5  # gone for 2 s
    assert slots.free() == 1 and not slots.holds(a) and a.stopped  # taken back, and it computes no more
    now[0] = 5.5  # b's camera keeps sending: 4 s between frames is under 5 s
    b.recv(camera_frame(1))
    now[0] = 9.5
    b.recv(camera_frame(2))
    assert slots.holds(b)
    now[0] = 15.0  # then nothing for 5.5 s
    assert slots.free() == 2 and b.stopped


def test_slots_are_shared_safely_by_many_sessions_at_once(tiny):
    """Twenty sessions press Start at the same moment on a 3-stream server: exactly three get a stream."""
    slots, start = StreamSlots(3), threading.Barrier(20)
    got: list = []

    def press(i):
        start.wait()
        got.append(slots.open(i, lambda: idle_stream(tiny)))

    threads = [threading.Thread(target=press, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(got) == 20 and sum(stream is not None for stream in got) == 3 and slots.free() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_live_frames_run_at_a_lower_priority_than_the_rest_of_the_server(tiny):
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    proc = LiveProcessor(LiveSettings(tiny, layer=1), nice=7)  # lowered on the worker thread itself
    try:
        proc.recv(camera_frame(5))
        wait_for(lambda: proc.latest is not None)  # the worker has run, so it has lowered its priority
        worker = proc._threads_started[0].native_id
        assert os.getpriority(os.PRIO_PROCESS, worker) == min(19, here + 7)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # the caller's is untouched
        assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == here  # and the process's main thread's
    finally:
        proc.stop()


def test_owner_sets_the_stream_cap_default_one_per_core():
    assert serving.policy({}).live_streams == core_count()
    assert serving.policy({"ATTNVIZ_LIVE_STREAMS": "3"}).live_streams == 3
    assert serving.policy({"ATTNVIZ_LIVE_STREAMS": " 0 "}).live_streams == 0  # the owner turns it off
    with pytest.raises(ValueError, match="ATTNVIZ_LIVE_STREAMS"):
        serving.policy({"ATTNVIZ_LIVE_STREAMS": "many"})


def test_a_16_bit_frame_gets_the_map_capture_gives_it(tiny):
    """One conversion for every picture: a 16-bit grey frame is scaled by its range, as capture() does,
    not clipped to white."""
    ramp = np.tile(np.linspace(0, 65535, 48).astype(np.uint16), (40, 1))  # (40, 48) left to right
    grey16 = Image.fromarray(ramp)
    assert grey16.mode.startswith("I;16")
    live = heatmap_frame(grey16, LiveSettings(tiny, layer=1))
    np.testing.assert_array_equal(live.cls_map, attnviz.capture(tiny, grey16).cls_map(1, "mean"))
    assert 60 < np.asarray(live.view).mean() < 200  # a grey ramp (clipping would make it all 255)


def test_no_live_frame_starts_while_a_photo_is_worked_on_nor_just_after(tiny):
    order = Priority(grace_s=0.3, patience_s=10.0)
    done_at: list[float] = []
    proc = LiveProcessor(LiveSettings(tiny, layer=1), priority=order,
                         encode=lambda picture: (done_at.append(time.monotonic()), picture)[1])
    try:
        with order.foreground():  # a visitor's photo is being decoded and captured
            proc.recv(camera_frame(1))
            time.sleep(0.4)
            assert done_at == [] and order.busy
            ended = time.monotonic()
        assert order.busy  # the photo's page still draws its views: grace
        wait_for(lambda: done_at)
        assert 0.3 <= done_at[0] - ended < 5.0
        assert not order.busy
    finally:
        proc.stop()


def test_a_live_frame_waits_for_page_work_no_longer_than_its_patience(tiny):
    order = Priority(grace_s=0.3, patience_s=0.5)
    proc = LiveProcessor(LiveSettings(tiny, layer=1), priority=order)
    try:
        with order.foreground():  # page work that goes on and on (a class uploading)
            asked = time.monotonic()
            proc.recv(camera_frame(2))
            wait_for(lambda: proc.latest is not None)
            assert 0.5 <= time.monotonic() - asked < 5.0  # the stream still moves, slowly
    finally:
        proc.stop()


@pytest.mark.parametrize("turns", [1, 2])
def test_live_frames_take_turns_in_the_order_they_asked(turns):
    order = Priority(background=turns, grace_s=0.0)
    computing, most, sequence, lock = [0], [0], [], threading.Lock()

    def stream(name):
        for _ in range(12):
            with order.background(stream=name):
                with lock:
                    computing[0] += 1
                    most[0] = max(most[0], computing[0])
                    sequence.append(name)
                time.sleep(0.01)
                with lock:
                    computing[0] -= 1

    threads = [threading.Thread(target=stream, args=(name,)) for name in "abc"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most[0] == turns and len(sequence) == 36
    if turns == 1:  # once all three wait, a released turn goes to the longest waiter: strict rotation
        steady = sequence[6:30]
        assert all(steady[i] != steady[i + 1] for i in range(len(steady) - 1)), sequence


def test_a_lone_stream_gets_a_turn_per_core_and_several_share_one():
    """``alone`` turns while one stream asks (its two workers compute side by side), ``background`` turns as soon
    as another stream asks too."""
    order = Priority(background=1, alone=2, grace_s=0.0)
    computing, most, lock = [0], {}, threading.Lock()

    def worker(name, phase):
        for i in range(10):
            with order.background(stream=name):
                with lock:
                    computing[0] += 1
                    if i >= 2:  # once every stream of the phase has asked (the first to ask was alone for a moment)
                        most[phase] = max(most.get(phase, 0), computing[0])
                time.sleep(0.01)
                with lock:
                    computing[0] -= 1

    def run(names, phase):
        threads = [threading.Thread(target=worker, args=(name, phase)) for name in names for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    run(["a"], "alone")  # one stream, two workers
    time.sleep(1.1)  # ALONE_S: stream a is forgotten
    run(["b", "c", "d"], "several")  # three streams, two workers each
    assert most == {"alone": 2, "several": 1}


def test_on_two_cores_live_frames_take_only_the_core_page_work_leaves():
    """Page work takes a core each (and one in its grace after): on two cores a photo leaves one core to the live
    frames — a lone stream's two workers then compute one at a time — and two photos leave none."""
    order = Priority.server(2)
    assert (order.turns, order.alone, order.cores) == (1, 2, 2)
    order = Priority(background=1, alone=2, grace_s=0.3, patience_s=10.0, cores=2)
    computing, most, started, lock = [0], [0], [], threading.Lock()

    def frame():
        with order.background(stream="a"):
            with lock:
                started.append(time.monotonic())
                computing[0] += 1
                most[0] = max(most[0], computing[0])
            time.sleep(0.2)
            with lock:
                computing[0] -= 1

    def frames(n):
        threads = [threading.Thread(target=frame) for _ in range(n)]
        for thread in threads:
            thread.start()
        return threads

    with order.foreground():  # one photo: one core left
        asked = time.monotonic()
        for thread in frames(2):
            thread.join(30)
        assert most[0] == 1 and started[0] - asked < 0.15 and started[1] - started[0] >= 0.2
    with order.foreground(), order.foreground():  # two photos at once: no core left
        threads = frames(1)
        time.sleep(0.4)
        assert len(started) == 2
        ended = time.monotonic()
    for thread in threads:
        thread.join(30)
    assert len(started) == 3 and started[2] - ended < 0.25  # the grace takes one core, the frame the other
    pause = order.pause_point()
    with order.foreground():
        start = time.monotonic()
        pause()  # a frame already running goes on beside one photo
        assert time.monotonic() - start < 0.1


def test_a_running_frame_stops_at_its_next_layer_while_a_photo_is_captured(tiny):
    """A frame already computing when a photo arrives waits between two blocks until the photo is done
    (and its grace is over), then ends with exactly the capture it would have made without waiting."""
    order = Priority(grace_s=0.2, patience_s=10.0)
    x = tiny.to_input(tiny.view(camera_frame(4)))
    entered, layers, result = threading.Event(), [], {}
    pause = order.pause_point()

    def between_layers():
        layers.append(time.monotonic())
        if len(layers) == 1:
            entered.set()
            time.sleep(0.2)  # the photo arrives while this frame is in its first layer
        pause()

    worker = threading.Thread(target=lambda: result.update(cap=attnviz.capture_tensor(tiny, x, between_layers)))
    worker.start()
    assert entered.wait(30)
    with order.foreground():
        time.sleep(0.5)
        assert len(layers) == 1 and worker.is_alive()  # held after layer 1 of 2, for as long as the photo takes
        ended = time.monotonic()
    worker.join(30)
    assert len(layers) == 2 and layers[1] - ended >= 0.2  # … and its grace
    plain = attnviz.capture_tensor(tiny, x)
    assert torch.equal(Q(result["cap"]), Q(plain)) and torch.equal(K(result["cap"]), K(plain))
    assert torch.equal(result["cap"].output, plain.output)


def test_a_frames_pauses_together_last_no_longer_than_its_patience(tiny):
    order = Priority(grace_s=0.0, patience_s=0.3)
    calls: list[float] = []
    pause = order.pause_point()
    with order.foreground():  # page work that goes on and on: the frame still ends
        start = time.monotonic()
        attnviz.capture_tensor(tiny, tiny.to_input(tiny.view(camera_frame(6))),
                               lambda: (calls.append(time.monotonic()), pause()))
        assert len(calls) == 2 and 0.3 <= time.monotonic() - start < 3.0  # one patience for both layers


def test_the_live_worker_gives_way_between_layers(tiny, monkeypatch):
    """LiveProcessor hands each frame's capture a fresh pause point of the server's, called after each block."""
    order = Priority(grace_s=0.0)
    calls: list[int] = []  # per frame made: how often its pause point was called
    real = order.pause_point

    def pause_point():
        pause, frame = real(), len(calls)
        calls.append(0)

        def counted():
            calls[frame] += 1
            pause()
        return counted

    monkeypatch.setattr(order, "pause_point", pause_point)
    proc = LiveProcessor(LiveSettings(tiny, layer=1), priority=order)
    try:
        for seed in (7, 8):
            before = proc.stats().heatmaps
            proc.recv(camera_frame(seed))
            wait_for(lambda: proc.stats().heatmaps > before)
        assert calls == [2, 2]  # one pause point per frame, reached after each of the 2 blocks
    finally:
        proc.stop()


@pytest.mark.parametrize("rows", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("reg_tokens", [0, 4])
def test_live_frames_on_a_runtime_draw_the_class_token_rows_alone_and_exactly(tmp_path, monkeypatch, reg_tokens, rows):
    """On a runtime a live frame runs the class-rows graph (no capture of every token's q and k); its map equals the
    PyTorch capture's for every layer and head choice — on either runtime, beside captures on ONNX Runtime (a server
    on ``auto`` with both installed runs the rows on OpenVINO)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip(rows)
    import attnviz.live as live

    tiny = tiny_vit(reg_tokens=reg_tokens)
    model = attnviz.fast(tiny, "onnxruntime", cache=tmp_path, threads=1, rows=rows)
    assert model.runtime.rows.runtime == rows
    frame = camera_frame(7)
    reference = attnviz.capture(tiny, frame)  # PyTorch, the whole capture
    monkeypatch.setattr(live, "capture_tensor", lambda *a, **k: pytest.fail("a live frame captured every token"))
    for layer in range(2):
        for head in ("mean", "max", "min", 0, 3):
            got = heatmap_frame(frame, LiveSettings(model, layer=layer, head=head)).cls_map
            assert got.shape == reference.grid
            assert np.abs(got - reference.cls_map(layer, head)).max() <= 1e-5


def test_a_rows_graph_that_is_not_exact_leaves_live_frames_on_the_capture(tmp_path, monkeypatch, caplog):
    pytest.importorskip("onnxruntime")
    from attnviz import runtimes

    tiny = tiny_vit()
    monkeypatch.setattr(runtimes, "rows_mismatch", lambda model, run: "it is off by 1.0e+00")
    model = attnviz.fast(tiny, "onnxruntime", cache=tmp_path, threads=1)
    frame = camera_frame(8)
    with caplog.at_level("WARNING", logger="attnviz.runtimes"):
        got = [heatmap_frame(frame, LiveSettings(model, layer=1, head="mean")).cls_map for _ in range(2)]
    assert [r.getMessage() for r in caplog.records] == [
        "tiny draws live frames from the whole capture: on onnxruntime it is off by 1.0e+00"]  # once
    assert model.runtime.class_rows(model.to_input(model.view(frame))) is None
    for m in got:
        assert np.abs(m - attnviz.capture(tiny, frame).cls_map(1, "mean")).max() <= 1e-5


def test_the_rows_check_refuses_rows_that_are_not_the_capture_s():
    from attnviz import runtimes

    tiny = tiny_vit()

    def rows(a, layers=(0, 1)):  # the rows of the input it is given, as the graph computes them
        cap = attnviz.capture_tensor(tiny, torch.as_tensor(np.asarray(a)))
        return [torch.stack([cap.layer_rows(l, 0) for l in layers]).numpy()]

    assert runtimes.rows_mismatch(tiny, rows) is None  # on every input of the certification set
    swapped = lambda a: rows(a, (1, 0))  # noqa: E731
    assert runtimes.rows_mismatch(tiny, swapped).startswith("on cat.jpg: layer 0's class-token row differs from PyTorch's by")
