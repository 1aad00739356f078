"""``python -m bench.video``: frames per second of ``attnviz video`` at 196 px against the capture alone,
and its peak memory for a short and a four-times-longer clip (memory must not grow with the length).

The clip is generated (moving shapes, 640 × 360, H.264, 30 fps, see ``tests/video_fixtures.py``). Per
frame, "capture alone" is ``capture_tensor`` on the model's input for an already decoded frame; the whole
pipeline is ``attnviz.video.render_video``: decode, turn upright, view, capture, class-token map,
overlay, H.264 encode. Each memory run is a fresh process (peak resident set, VmHWM). The target is
≥ 10 frames per second on a 2-core machine; the machine's other load is printed and not controlled.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys
import attnviz
from attnviz import video
model = attnviz.load_model(device="cpu")
video.render_video(sys.argv[1], sys.argv[2], model)
for line in open("/proc/self/status"):
    if line.startswith("VmHWM"):
        print(int(line.split()[1]) // 1024)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of the timed clip (default 3 s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three timings (default 3)")
    parser.add_argument("--memory", action="store_true", help="also the peak memory of a 2 s and an 8 s clip")
    args = parser.parse_args()
    import torch

    import attnviz
    from attnviz import video
    from attnviz.capture import capture_tensor
    from tests.video_fixtures import write_clip  # the clip generator the tests use (run from the checkout)

    model = attnviz.load_model(device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        clip = write_clip(Path(tmp) / "clip.mp4", round(30 * args.seconds), fps=30, width=640, height=360)
        frames = list(video.decoded_frames(clip))  # for the capture-alone timing only
        inputs = [model.to_input(model.view(f)) for f in frames]
        capture_tensor(model, inputs[0])  # warm
        rounds = {"forward": [], "capture": [], "video": []}
        for r in range(args.rounds):  # interleaved: the machine's other load changes from minute to minute
            start = time.perf_counter()
            with torch.inference_mode():
                for x in inputs:
                    model.network(x)
            rounds["forward"].append(len(inputs) / (time.perf_counter() - start))
            start = time.perf_counter()
            for x in inputs:
                capture_tensor(model, x)
            rounds["capture"].append(len(inputs) / (time.perf_counter() - start))
            rounds["video"].append(video.render_video(clip, Path(tmp) / f"out{r}.mp4", model).frames_per_second)
        load = os.getloadavg()
        print(f"attnviz video, {model.public_name} at {model.size} px, {len(frames)} frames of 640 × 360 at 30 fps, "
              f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs; {args.rounds} interleaved rounds; load "
              f"average {load[0]:.1f} / {load[1]:.1f} (shared machine: other work ran at the same time)\n")
        print("| what | frames/s, median | each round |")
        print("|---|---|---|")
        for key, what in (("forward", "timm forward alone (no capture)"), ("capture", "capture alone (capture_tensor)"),
                          ("video", "attnviz video: decode + upright + capture + overlay + H.264 encode")):
            each = ", ".join(f"{v:.1f}" for v in rounds[key])
            print(f"| {what} | {statistics.median(rounds[key]):.1f} | {each} |")
        if args.memory:
            print("\n| clip | frames | peak memory, MB |")
            print("|---|---|---|")
            for seconds in (2, 8):
                src = write_clip(Path(tmp) / f"m{seconds}.mp4", 30 * seconds, fps=30, width=640, height=360)
                peak = subprocess.run([sys.executable, "-c", CHILD, str(src), str(Path(tmp) / f"m{seconds}_out.mp4")],
                                      capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()[-1]
                print(f"| {seconds} s | {30 * seconds} | {peak} |")


if __name__ == "__main__":
    main()
