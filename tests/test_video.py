"""attnviz video: generated clips in, an H.264 MP4 out whose frame i is the overlay of a capture of input
frame i (recomputed here from the timm blocks), with the right count, duration, orientation and metadata."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

av = pytest.importorskip("av")

import attnviz
from attnviz import cli, render, video
from conftest import tiny_vit
from test_capture import reference_weights
from video_fixtures import read_frames, write_clip, write_hidden_frames, write_size_switch

CODEC_TOLERANCE = 4.0  # mean |decoded − drawn| per channel, 0…255: H.264 at crf 18 on these small frames
LUT_STEP = 4  # max |drawn − expected| per pixel: a weight recomputed differently (≈1e-7) may fall one colour bin over


@pytest.fixture(scope="module")
def tiny():
    return tiny_vit()


def expected_overlay(model, stored: np.ndarray, rotation: int = 0, layer: int = 1, scale: int = 2) -> np.ndarray:
    """What result frame should show for one stored input frame: upright by numpy (rot90 is counter-clockwise,
    as the display matrix is), the model's view, the class token's mean row recomputed from the blocks."""
    upright = Image.fromarray(np.ascontiguousarray(np.rot90(stored, k=rotation // 90)))
    view = model.view(upright)
    ref = reference_weights(model.network, model.to_input(view))[layer]  # (H, N, N) float64
    h, w = model.grid
    cls = ref.mean(0)[0, model.num_prefix_tokens:].reshape(h, w)
    picture = render.overlay(view, cls.astype(np.float32))
    side = model.size * scale
    return np.asarray(picture.resize((side, side), Image.Resampling.NEAREST)).astype(np.int16)


def run(tiny, src, out, **settings):
    drawn: list[np.ndarray] = []
    result = video.render_video(src, out, tiny, video.VideoSettings(**settings),
                                on_frame=lambda i, picture: drawn.append(np.asarray(picture).astype(np.int16)))
    return result, drawn


def test_frame_i_is_the_overlay_of_a_capture_of_input_frame_i(tiny, tmp_path):
    src = write_clip(tmp_path / "shapes.mp4", 20, fps=30)
    result, drawn = run(tiny, src, tmp_path / "out.mp4")
    stored = read_frames(src)
    assert result.frames_in == 20 and result.frames_out == 20 and result.every == 1
    for i, frame in enumerate(drawn):
        assert np.abs(frame - expected_overlay(tiny, stored[i])).max() <= LUT_STEP
    with av.open(str(tmp_path / "out.mp4")) as c:
        stream = c.streams.video[0]
        assert stream.codec_context.name == "h264" and (stream.width, stream.height) == (64, 64)
        assert stream.frames == 20 and float(stream.duration * stream.time_base) == pytest.approx(20 / 30, abs=1e-3)
        decoded = [f.to_ndarray(format="rgb24").astype(np.int16) for f in c.decode(stream)]
    assert len(decoded) == 20
    for i, frame in enumerate(decoded):
        errors = [np.abs(frame - other).mean() for other in drawn]
        assert errors[i] <= CODEC_TOLERANCE and int(np.argmin(errors)) == i  # frame i, not a neighbour


def test_a_60_fps_clip_is_sampled_every_2nd_frame_and_says_so(tiny, tmp_path):
    src = write_clip(tmp_path / "fast.mp4", 30, fps=60)
    result, drawn = run(tiny, src, tmp_path / "out.mp4")
    assert (result.every, result.fps, result.frames_in, result.frames_out) == (2, 30.0, 30, 15)
    stored = read_frames(src)
    for j, frame in enumerate(drawn):
        assert np.abs(frame - expected_overlay(tiny, stored[2 * j])).max() <= LUT_STEP
    with av.open(str(tmp_path / "out.mp4")) as c:
        stream = c.streams.video[0]
        assert stream.frames == 15 and float(stream.average_rate) == 30
        assert float(stream.duration * stream.time_base) == pytest.approx(0.5, abs=1e-3)  # as long as the source
        assert "every 2nd frame of fast.mp4 (60 fps → 30 fps)" in c.metadata["comment"]


def test_asked_fps_picks_every_nth(tiny, tmp_path):
    src = write_clip(tmp_path / "c.mp4", 12, fps=30)
    result, _ = run(tiny, src, tmp_path / "out.mp4", fps=10)
    assert (result.every, result.frames_out) == (3, 4)


@pytest.mark.parametrize("rotation", [90, 270, 180])
def test_a_rotated_phone_mov_comes_out_upright(tiny, tmp_path, rotation):
    src = write_clip(tmp_path / "phone.mov", 4, fps=30, width=96, height=64, rotation=rotation)
    with av.open(str(src)) as c:
        assert next(c.decode(video=0)).rotation % 360 == rotation  # the display matrix is really there (270 reads -90)
    result, drawn = run(tiny, src, tmp_path / "out.mp4")
    stored = read_frames(src)
    for i, frame in enumerate(drawn):
        assert np.abs(frame - expected_overlay(tiny, stored[i], rotation)).max() <= LUT_STEP
        # and not what the stored (sideways) pixels would give
        assert np.abs(frame - expected_overlay(tiny, stored[i], 0)).mean() > 5
    with av.open(str(tmp_path / "out.mp4")) as c:
        assert all(f.rotation == 0 for f in c.decode(video=0))  # the result's pixels are upright themselves


def test_an_odd_sized_clip(tiny, tmp_path):
    src = write_clip(tmp_path / "odd.mp4", 5, fps=25, width=161, height=97, codec="libx264rgb")
    result, drawn = run(tiny, src, tmp_path / "out.mp4", scale=3)
    assert result.source.width == 161 and result.source.height == 97 and len(drawn) == 5
    stored = read_frames(src)
    assert np.abs(drawn[2] - expected_overlay(tiny, stored[2], scale=3)).max() <= LUT_STEP
    with av.open(str(tmp_path / "out.mp4")) as c:
        assert (c.streams.video[0].width, c.streams.video[0].height) == (96, 96) and c.streams.video[0].frames == 5


def test_real_model_on_a_rotated_mov(real_model, tmp_path):
    src = write_clip(tmp_path / "phone.mov", 3, fps=30, width=240, height=160, rotation=270)
    drawn = []
    result = video.render_video(src, tmp_path / "out.mp4", real_model, video.VideoSettings(layer=11, scale=1),
                                on_frame=lambda i, p: drawn.append(np.asarray(p).astype(np.int16)))
    assert result.frames_out == 3 and drawn[0].shape == (196, 196, 3)
    stored = read_frames(src)
    assert np.abs(drawn[1] - expected_overlay(real_model, stored[1], 270, layer=11, scale=1)).max() <= LUT_STEP


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_not_a_video_and_a_damaged_one_leave_nothing(tiny, tmp_path):
    notes = tmp_path / "notes.mp4"
    notes.write_text("these are my notes, not a video\n")
    with pytest.raises(video.VideoError, match=r"^notes.mp4 is not a video attnviz can read .*; use an MP4"):
        video.render_video(notes, tmp_path / "a.mp4", tiny)
    good = write_clip(tmp_path / "good.mp4", 30, fps=30)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # the index (moov) is at the end: lost
    with pytest.raises(video.VideoError) as error:
        video.render_video(cut, tmp_path / "b.mp4", tiny)
    assert str(error.value).startswith("cut.mp4 ") and str(error.value).count(".") >= 1 and "\n" not in str(error.value)
    assert leftovers(tmp_path) == ["cut.mp4", "good.mp4", "notes.mp4"]  # no result, no .part file


def test_a_decoding_failure_midway_leaves_no_partial_output(tiny, tmp_path, monkeypatch):
    src = write_clip(tmp_path / "clip.mp4", 20, fps=30)
    real = video.Frames.__iter__

    def breaks(self):
        for i, picture in real(self):
            if i == 12:
                raise video.VideoError("clip.mp4 is damaged: a frame could not be decoded; nothing was written.")
            yield i, picture

    monkeypatch.setattr(video.Frames, "__iter__", breaks)
    with pytest.raises(video.VideoError, match="damaged"):
        video.render_video(src, tmp_path / "out.mp4", tiny, video.VideoSettings(batch=4))
    assert leftovers(tmp_path) == ["clip.mp4"]


@pytest.mark.parametrize("limits, message", [
    (video.Limits(seconds=1.0), r"clip.mp4 is 2.0 s long; videos up to 1 s can be used"),
    (video.Limits(pixels=160 * 120 - 1), r"clip.mp4 is 160 × 120 pixels; videos up to 0.0 megapixels"),
    (video.Limits(bytes=100), r"clip.mp4 is 0 MB; videos up to 0 MB"),
])
def test_limits_are_checked_from_the_header_before_any_frame(tiny, tmp_path, monkeypatch, limits, message):
    src = write_clip(tmp_path / "clip.mp4", 60, fps=30)

    def never(*args, **kwargs):
        raise AssertionError("a frame was decoded")

    monkeypatch.setattr(video.Frames, "__iter__", never)
    with pytest.raises(video.VideoError, match=message):
        video.render_video(src, tmp_path / "out.mp4", tiny, limits=limits)
    assert leftovers(tmp_path) == ["clip.mp4"]


@pytest.fixture
def loaded(monkeypatch):
    model = tiny_vit()
    monkeypatch.setattr(attnviz.models, "load_model", lambda *args, **kwargs: model)
    return model


def test_cli_writes_the_mp4_and_says_what_it_did(loaded, tmp_path, capsys):
    src = write_clip(tmp_path / "clip.mov", 12, fps=60)
    out = tmp_path / "out.mp4"
    assert cli.main(["video", str(src), "--out", str(out), "--layer", "2", "--head", "3", "--fps", "20", "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "layer 2, head 3" in said and "every 3rd frame of clip.mov (60 fps → 20 fps)" in said
    assert "4 frames of 12" in said
    with av.open(str(out)) as c:
        assert c.streams.video[0].frames == 4 and "layer 2, head 3" in c.metadata["comment"]


@pytest.mark.parametrize("argv, code, message", [
    (["--head", "0"], 2, "--head takes a number from 1"),
    (["--layer", "9"], 2, "--layer 9: tiny has 2 layers."),
    (["--fps", "0"], 2, "--fps must be above 0"),
    (["--out", "x.avi"], 2, "--out must name an .mp4 file"),
])
def test_cli_bad_options_are_one_line(loaded, tmp_path, capsys, argv, code, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = write_clip(tmp_path / "clip.mp4", 3, fps=30)
    assert cli.main(["video", str(src), "--out", "out.mp4", "--quiet", *argv]) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert leftovers(tmp_path) == ["clip.mp4"]


def test_cli_not_a_video_is_one_line_and_exit_1(loaded, tmp_path, capsys):
    bad = tmp_path / "photo.mov"
    bad.write_bytes(b"\x00" * 1000)
    assert cli.main(["video", str(bad), "--out", str(tmp_path / "out.mp4"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: photo.mov is not a video") and err.count("\n") == 1
    assert leftovers(tmp_path) == ["photo.mov"]


def test_frame_at_is_the_upright_frame(tmp_path):
    src = write_clip(tmp_path / "phone.mov", 5, fps=30, width=96, height=64, rotation=90)
    stored = read_frames(src)
    frame = np.asarray(video.frame_at(src, 3))
    assert frame.shape == (96, 64, 3) and (frame == np.rot90(stored[3])).all()
    with pytest.raises(video.VideoError, match="has only 5 frames, not 9"):
        video.frame_at(src, 8)


PEAK = r"""
import sys
from conftest import tiny_vit  # run from the tests folder
from attnviz import video
video.render_video(sys.argv[1], sys.argv[2], tiny_vit())
print([int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] // 1024)
"""


@pytest.mark.slow  # ~2 min on the shared 2-core machine (two processes, 550 frames)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak memory from /proc")
def test_memory_is_flat_in_the_videos_length(tmp_path):
    """Ten times the frames, the same peak: a whole-video array of the long clip alone would be 115 MB."""
    import subprocess
    import sys

    peaks = []
    for frames in (50, 500):
        src = write_clip(tmp_path / f"c{frames}.mp4", frames, fps=30, width=320, height=240)
        out = subprocess.run([sys.executable, "-c", PEAK, str(src), str(tmp_path / f"o{frames}.mp4")],
                             capture_output=True, text=True, check=True, cwd=Path(__file__).parent)
        peaks.append(int(out.stdout.split()[-1]))  # MB
    print(f"peak memory: {peaks[0]} MB for 50 frames, {peaks[1]} MB for 500 frames")
    assert peaks[1] - peaks[0] < 25, peaks


def test_every_refusal_reads_in_both_languages(tmp_path):
    from attnviz import i18n

    src = write_clip(tmp_path / "clip.mp4", 60, fps=30)
    notes = tmp_path / "notes.mov"
    notes.write_text("not a video")
    errors = []
    for source, limits in ((src, video.Limits(seconds=1.0)), (src, video.Limits(pixels=100)),
                           (src, video.Limits(bytes=100)), (notes, video.Limits())):
        with pytest.raises(video.VideoError) as caught:
            video.probe(source, limits)
        errors.append(caught.value)
    for limits in (video.Limits(frames=10), video.Limits(decoded_pixels=100)):
        with pytest.raises(video.VideoError) as caught:
            video.probe(src, limits)
        errors.append(caught.value)
    for limits, stop in ((video.Limits(frames=10), None), (video.Limits(work_seconds=0.0), None),
                         (video.Limits(), lambda: True), (video.Limits(packets=10), None),
                         (video.Limits(drawn=10), None), (video.Limits(stall_seconds=-1.0), None)):
        with pytest.raises(video.VideoError) as caught:
            list(video.Frames(src, limits=limits, stop=stop))  # held while decoding, whatever the header says
        errors.append(caught.value)
    with pytest.raises(video.VideoError) as caught:
        list(video.Frames(write_size_switch(tmp_path / "switch.mp4"), limits=video.Limits()))
    errors.append(caught.value)
    with pytest.raises(video.VideoError) as caught:
        video.render_video(src, tmp_path / "out.mp4", tiny_vit(), limits=video.Limits(drawn=10))
    errors.append(caught.value)
    assert [e.key for e in errors] == ["too_long", "too_many_pixels", "too_large", "not_video", "too_many_frames",
                                       "too_many_pixels_in_all", "too_many_frames_decoded", "too_slow", "stopped",
                                       "too_many_packets", "too_many_drawn_decoded", "stalled", "size_changed",
                                       "too_many_drawn"]
    for error in errors:
        for lang in i18n.LANGUAGES:
            sentence = i18n.text(lang, f"video.error_{error.key}", **error.values)
            assert error.values["name"] in sentence and "{" not in sentence
    assert i18n.text("zh-TW", "video.error_too_long", **errors[0].values) == \
        "clip.mp4 長 2.0 秒；影片最長 1 秒，請先剪短。"


# --- hostile files: the limits hold for every decoded frame, not only for the header ----------------------


def test_an_in_band_switch_to_a_larger_frame_size_is_refused_before_such_a_frame_is_decoded(tiny, tmp_path,
                                                                                           monkeypatch):
    """The header (and 4 frames) say 64 × 48; then a new SPS switches the stream to 1024 × 768. Before, every
    later frame was decoded (and drawn) at full size: an 8192 × 8192 switch cost the CLI ~2.9 GB."""
    src = write_size_switch(tmp_path / "switch.mp4", (64, 48), (1024, 768), frames=4)
    info = video.probe(src)
    assert (info.width, info.height, info.frames) == (64, 48, 8)  # the header passes every limit
    seen = []
    real = video.upright
    monkeypatch.setattr(video, "upright", lambda frame: seen.append((frame.width, frame.height)) or real(frame))
    with pytest.raises(video.VideoError) as error:
        video.render_video(src, tmp_path / "out.mp4", tiny, video.VideoSettings(batch=2))
    assert str(error.value) == ("switch.mp4 changes its frame size mid-stream from 64 × 48 to 1024 × 768 pixels, "
                                "larger than its header says, so it cannot be used.")
    assert error.value.key == "size_changed" and error.value.values["new_width"] == 1024
    assert seen == [(64, 48)] * 4  # no 1024 × 768 frame ever reached Python
    assert leftovers(tmp_path) == ["switch.mp4"]
    frames = video.Frames(src)
    with pytest.raises(video.VideoError, match="changes its frame size"):
        list(frames)
    assert frames.decoded == 4  # the decoder refused the first large frame rather than allocate it


def test_tiny_frames_at_a_high_rate_are_refused_from_the_header(tiny, tmp_path, monkeypatch):
    """8 s of 16 × 16 frames at 1000 fps: within seconds, pixels and bytes, but 8000 frames to decode."""
    src = write_clip(tmp_path / "fast.mp4", 8000, fps=1000, width=16, height=16)
    monkeypatch.setattr(video.Frames, "__iter__", lambda self: (_ for _ in ()).throw(AssertionError("decoded")))
    with pytest.raises(video.VideoError) as error:
        video.render_video(src, tmp_path / "out.mp4", tiny)
    assert str(error.value) == ("fast.mp4 has 8000 frames; videos of up to 7200 frames can be used, so lower its "
                                "frame rate or cut it shorter first.")
    assert error.value.key == "too_many_frames" and leftovers(tmp_path) == ["fast.mp4"]


def test_only_the_sampled_frames_become_pictures_and_every_decoded_frame_counts(tiny, tmp_path, monkeypatch):
    src = write_clip(tmp_path / "fast.mp4", 240, fps=240, width=16, height=16)
    converted = []
    real = video.upright
    monkeypatch.setattr(video, "upright", lambda frame: converted.append(frame.pts) or real(frame))
    result, drawn = run(tiny, src, tmp_path / "out.mp4")
    assert (result.every, result.frames_in, result.frames_out) == (8, 240, 30)
    assert len(converted) == 30 and len(drawn) == 30  # before: all 240 were turned into pictures
    # the frame count is held while decoding too (a header that does not say, or lies)
    frames = video.Frames(src, limits=video.Limits(frames=100))
    with pytest.raises(video.VideoError, match=r"^fast.mp4 has more than 100 frames; videos of up to 100 frames"):
        list(frames)
    assert frames.decoded == 101
    with pytest.raises(video.VideoError, match=r"holds 0.0 gigapixels of frames; videos up to 0.0 gigapixels"):
        list(video.Frames(src, limits=video.Limits(decoded_pixels=16 * 16 * 50)))


def test_a_job_over_its_wall_budget_or_nobody_waits_for_stops_and_leaves_nothing(tiny, tmp_path):
    src = write_clip(tmp_path / "clip.mp4", 20, fps=30)
    with pytest.raises(video.VideoError) as error:
        video.render_video(src, tmp_path / "out.mp4", tiny, limits=video.Limits(work_seconds=0.0))
    assert error.value.key == "too_slow" and str(error.value).startswith("clip.mp4 took longer than 0 s to draw")
    asked = []
    with pytest.raises(video.VideoError) as error:
        video.render_video(src, tmp_path / "out.mp4", tiny, stop=lambda: asked.append(1) or len(asked) > 5)
    assert error.value.key == "stopped" and len(asked) == 6
    assert leftovers(tmp_path) == ["clip.mp4"]



def test_tiny_frames_at_a_high_rate_in_a_header_without_a_count_are_counted_while_decoding(tiny, tmp_path,
                                                                                           monkeypatch):
    """The same hostile rate in a file whose header says neither length nor frame count (streamed Matroska):
    the job ends at the frame limit, and only the sampled frames before it became pictures."""
    src = write_clip(tmp_path / "fast.mkv", 400, fps=1000, width=16, height=16, streamed=True)
    info = video.probe(src)
    assert (info.frames, info.seconds, info.fps) == (None, None, 1000.0)
    converted = []
    real = video.upright
    monkeypatch.setattr(video, "upright", lambda frame: converted.append(1) or real(frame))
    with pytest.raises(video.VideoError) as error:
        video.render_video(src, tmp_path / "out.mp4", tiny, limits=video.Limits(frames=300))
    assert error.value.key == "too_many_frames_decoded"
    assert len(converted) == 10  # every 33rd of frames 0 … 299 (1000 fps → 30 fps)
    assert leftovers(tmp_path) == ["fast.mkv"]


def test_the_frames_drawn_are_bounded_from_the_header_and_while_decoding(tiny, tmp_path, monkeypatch):
    """Every drawn frame is a pass of the model: their number is a limit of its own (the frames decoded
    bound it only loosely: 7200 of them at a requested 240 fps would all be drawn)."""
    src = write_clip(tmp_path / "fast.mp4", 240, fps=240, width=16, height=16)
    with monkeypatch.context() as m:
        m.setattr(video.Frames, "__iter__", lambda self: (_ for _ in ()).throw(AssertionError("decoded")))
        with pytest.raises(video.VideoError) as error:
            video.render_video(src, tmp_path / "out.mp4", tiny, video.VideoSettings(fps=240),
                               limits=video.Limits(drawn=100))
    assert str(error.value) == ("fast.mp4 needs 240 frames drawn; up to 100 can be drawn, so ask for fewer frames "
                                "per second or cut it shorter first.")
    assert error.value.key == "too_many_drawn" and leftovers(tmp_path) == ["fast.mp4"]
    assert video.render_video(src, tmp_path / "out.mp4", tiny, limits=video.Limits(drawn=30)).frames_out == 30
    streamed = write_clip(tmp_path / "fast.mkv", 240, fps=240, width=16, height=16, streamed=True)
    converted = []
    real = video.upright
    monkeypatch.setattr(video, "upright", lambda frame: converted.append(1) or real(frame))
    frames = video.Frames(streamed, limits=video.Limits(drawn=100))
    with pytest.raises(video.VideoError) as error:
        list(frames)
    assert error.value.key == "too_many_drawn_decoded" and str(error.value).startswith(
        "fast.mkv needs more than 100 frames drawn; up to 100 can be drawn")
    assert (frames.used, len(converted)) == (101, 100)  # refused before the 101st became a picture


class Clock:
    """``time`` for :mod:`attnviz.video` whose clock moves 10 ms each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.01
        return self.now


def test_packets_that_make_no_frame_are_counted_and_cannot_outrun_the_budget(tiny, tmp_path, monkeypatch):
    """Hidden VP9 frames are decoded but never shown: no frame comes out, so no frame or pixel limit sees
    them. Before, nothing was asked between frames: a 50 MB upload of hidden 4K keyframes decoded for
    190 s with no check, and a closed tab did not stop it."""
    src = write_hidden_frames(tmp_path / "hidden.mkv", packets=300)
    info = video.probe(src)
    assert (info.codec, info.frames, info.seconds) == ("vp9", None, None)  # the header passes every limit
    asked = []
    frames = video.Frames(src, stop=lambda: asked.append(1) or len(asked) > 20)
    with pytest.raises(video.VideoError) as error:
        list(frames)
    assert error.value.key == "stopped" and (frames.packets, frames.decoded) == (20, 1)  # each packet, and its frame
    frames = video.Frames(src, limits=video.Limits(packets=100))
    with pytest.raises(video.VideoError) as error:
        list(frames)
    assert str(error.value) == ("hidden.mkv holds more than 100 packets of video, more than its frames can need, "
                                "so it cannot be used.")
    assert error.value.key == "too_many_packets" and frames.packets == 101
    monkeypatch.setattr(video, "time", Clock())
    with pytest.raises(video.VideoError) as error:
        video.render_video(src, tmp_path / "out.mp4", tiny, limits=video.Limits(stall_seconds=1.0))
    assert str(error.value) == ("hidden.mkv was decoded for 1 s without a frame to show (it may hold hidden frames), "
                                "so it was stopped.")
    assert error.value.key == "stalled" and leftovers(tmp_path) == ["hidden.mkv"]
    # on the same clock, a clip whose frames come out is never taken for a stall
    clip = write_clip(tmp_path / "steady.mp4", 120, fps=30, width=32, height=32)
    assert video.render_video(clip, tmp_path / "out.mp4", tiny, limits=video.Limits(stall_seconds=1.0)).frames_out == 120


def test_a_video_in_memory_is_read_and_written_without_a_file(tiny, tmp_path):
    import io

    data = write_clip(tmp_path / "clip.mp4", 6, fps=30).read_bytes()
    info = video.probe(data, name="upload.mp4")
    assert (info.name, info.frames, info.bytes) == ("upload.mp4", 6, len(data))
    out = io.BytesIO()
    result = video.render_video(data, out, tiny, name="upload.mp4")
    assert result.frames_out == 6 and result.source.name == "upload.mp4"
    first = np.asarray(video.frame_at(out.getvalue(), 0))
    assert first.shape == (64, 64, 3)
    assert np.array_equal(np.asarray(video.frame_at(data, 3)), np.asarray(video.frame_at(tmp_path / "clip.mp4", 3)))


def test_docs_robustness_states_the_limits_the_code_enforces():
    from conftest import ROOT

    text = (ROOT / "docs" / "robustness.md").read_text()
    limits = video.Limits()
    for row in (f"| video file | {limits.bytes // 2**20} MB |", f"| video length | {limits.seconds:.0f} s,",
                f"| video frames decoded | {limits.frames} (60 s at 120 fps)",
                f"| video pixels decoded in all | {limits.decoded_pixels / 1e9:.0f} gigapixels",
                f"| video job wall time | {limits.work_seconds:.0f} s,", "| video frame size | 3840 × 2160 (4K)",
                f"| video packets read | {limits.packets} (two a frame)", f"| video frames drawn | {limits.drawn} (60 s at 60 fps;",
                f"| video decoding without a frame | {limits.stall_seconds:.0f} s"):
        assert row in text, row
    assert limits.pixels == 3840 * 2160
