"""``python -m bench.live``: the live camera's speed in headless Chromium with its fake camera.

One real server, one browser streaming the fake camera at 196 px. Printed, side by side with the targets:
- heatmaps per second and the time from a camera frame's arrival at the server to its heatmap being
  sent back (both measured by the server's ``LiveProcessor`` and read from the page's speed line);
- what the browser saw: distinct heatmap frames per second on the page's output video, and its own
  share of the delay from WebRTC's statistics (encoding the camera, jitter buffer and decoding the
  heatmap) and the network round trip, so the whole camera → heatmap delay can be added up.
"""
from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path
import attnviz
from bench import machine

ASSETS = Path(attnviz.__file__).with_name("assets")  # the sample photos the package ships


SPEED = re.compile(r"([\d.]+) heatmaps per second · (\d+) ms")

# Every RTCPeerConnection the page makes, kept so its getStats() can be read (runs in every frame).
KEEP_PEERS = """
(() => {
  const Original = window.RTCPeerConnection;
  if (!Original) return;
  window.__peers = [];
  window.RTCPeerConnection = function (...args) { const pc = new Original(...args); window.__peers.push(pc); return pc; };
  window.RTCPeerConnection.prototype = Original.prototype;
})();
"""

# Count output frames whose picture differs from the previous one (the server repeats its newest heatmap
# for every camera frame; a new heatmap changes the picture).
COUNT_FRAMES = """
(seconds) => new Promise((resolve) => {
  const v = document.querySelector('video');
  const c = document.createElement('canvas'); c.width = 28; c.height = 28;
  const g = c.getContext('2d', {willReadFrequently: true});
  let last = null, changed = 0, shown = 0;
  const start = performance.now();
  const step = () => {
    g.drawImage(v, 0, 0, 28, 28);
    const d = g.getImageData(0, 0, 28, 28).data;
    if (last) {
      let diff = 0;
      for (let i = 0; i < d.length; i += 4) diff += Math.abs(d[i] - last[i]) + Math.abs(d[i + 1] - last[i + 1]) + Math.abs(d[i + 2] - last[i + 2]);
      if (diff / (28 * 28 * 3) > 1.0) changed += 1;
    }
    last = d; shown += 1;
    if (performance.now() - start < seconds * 1000) v.requestVideoFrameCallback(step);
    else resolve({changed, shown, seconds: (performance.now() - start) / 1000});
  };
  v.requestVideoFrameCallback(step);
})
"""

WEBRTC_STATS = """
async () => {
  const out = {};
  for (const pc of window.__peers || []) {
    const report = await pc.getStats();
    report.forEach((s) => {
      if (s.type === 'outbound-rtp' && s.kind === 'video' && s.framesEncoded) out.encode_ms = 1000 * s.totalEncodeTime / s.framesEncoded;
      if (s.type === 'inbound-rtp' && s.kind === 'video' && s.framesDecoded) {
        out.decode_ms = 1000 * s.totalDecodeTime / s.framesDecoded;
        if (s.jitterBufferEmittedCount) out.jitter_ms = 1000 * s.jitterBufferDelay / s.jitterBufferEmittedCount;
      }
      if (s.type === 'candidate-pair' && s.state === 'succeeded' && s.currentRoundTripTime !== undefined) out.rtt_ms = 1000 * s.currentRoundTripTime;
    });
  }
  return out;
}
"""


def live_speed(seconds: float = 10.0, warmup: float = 5.0, launcher: list[str] | None = None) -> dict[str, float]:
    """Stream the fake camera for ``warmup`` + ``seconds`` and return the measured speed; ``launcher``: how the
    server is started (None: ``streamlit run app.py``; ``tests.serve.ATTNVIZ_APP``: ``attnviz app``)."""
    from tests.serve import FAKE_CAMERA_FLAGS, chromium, streamlit_server

    with streamlit_server(launcher=launcher) as (url, _), chromium(FAKE_CAMERA_FLAGS) as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.add_init_script(KEEP_PEERS)
        page = context.new_page()
        page.goto(url)
        page.get_by_text("Live camera", exact=True).click(timeout=120_000)
        page.frame_locator("iframe[title*='webrtc']").get_by_role("button", name="Start").click(timeout=60_000)
        page.get_by_text("heatmaps per second").wait_for(timeout=120_000)
        time.sleep(warmup)
        frame = next(f for f in page.frames if "webrtc" in f.url)
        seen = frame.evaluate(COUNT_FRAMES, seconds)  # reads the video while it plays: `seconds` long
        lines = []
        for _ in range(3):  # the page's speed line covers the last few seconds: read it over a few
            lines.append(SPEED.search(page.get_by_text("heatmaps per second").inner_text()))
            time.sleep(1.0)
        rtc = frame.evaluate(WEBRTC_STATS)
    fps = statistics.median(float(m.group(1)) for m in lines if m)
    latency = statistics.median(float(m.group(2)) for m in lines if m)
    return {"fps": fps, "latency_ms": latency, "browser_fps": seen["changed"] / seen["seconds"],
            "video_fps": seen["shown"] / seen["seconds"], **rtc}


def processor_speed(workers: int, threads: int | None, seconds: float = 8.0, rate: float = 20.0,
                    runtime: str | None = None) -> dict:
    """The newest-frame worker alone, fed a moving 320 × 240 picture at ``rate`` frames/s (no video);
    with ``runtime``, its captures on that runtime (:func:`attnviz.fast`, where checked exact)."""
    import torch
    from PIL import Image

    import attnviz
    from attnviz.live import LiveProcessor, LiveSettings

    model = attnviz.load_model(size=196, device="cpu")
    if runtime is not None:
        model = attnviz.fast(model, runtime, threads=threads or torch.get_num_threads())
    photo = Image.open(ASSETS / "cat.jpg").convert("RGB").resize((480, 360))
    frames = [photo.crop((i, i, i + 320, i + 240)) for i in range(0, 100, 5)]  # a slow pan
    proc = LiveProcessor(LiveSettings(model, layer=model.depth - 1), workers=workers, threads=threads)
    try:
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            proc.recv(frames[i % len(frames)])
            i += 1
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
        stats = proc.stats()
    finally:
        proc.stop()
        proc.join(5)
    return {"workers": workers, "threads": threads or torch.get_num_threads(), "fps": stats.fps,
            "runtime": model.runtime.name if model.runtime is not None else "pytorch",
            "latency_ms": stats.latency_ms, "compute_ms": stats.compute_ms,
            "dropped": stats.dropped / max(1, stats.frames_in)}


def line(r: dict[str, float], way: str) -> str:
    browser = r.get("encode_ms", float("nan")) + r.get("jitter_ms", float("nan")) + r.get("decode_ms", float("nan"))
    return (
        f"Live camera through `{way}`, 196 px, headless Chromium fake camera: {r['fps']:.1f} heatmaps/s (target "
        f"≥ 15) and {r['latency_ms']:.0f} ms from a camera frame reaching the server to its heatmap leaving it, "
        f"{r['latency_ms'] + browser + r.get('rtt_ms', float('nan')):.0f} ms from the camera to the heatmap on the "
        f"screen (target ≤ 120 ms); the browser saw {r['browser_fps']:.1f} new heatmap frames/s in a "
        f"{r['video_fps']:.0f} frames/s video, and adds {browser:.0f} ms of its own (camera encode "
        f"{r.get('encode_ms', float('nan')):.1f}, jitter buffer {r.get('jitter_ms', float('nan')):.0f}, "
        f"heatmap decode {r.get('decode_ms', float('nan')):.1f}) plus a {r.get('rtt_ms', float('nan')):.1f} ms "
        f"network round trip"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.live")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--processor", action="store_true",
                        help="also time the worker alone (no browser) with 1 or 2 workers and threads")
    args = parser.parse_args()
    if args.processor:
        print("| workers × PyTorch threads | heatmaps/s | frame → heatmap sent | compute per frame | frames dropped |")
        print("|---|---|---|---|---|")
        for workers, threads in ((1, None), (1, 1), (2, 1)):
            r = processor_speed(workers, threads)
            print(f"| {r['workers']} × {r['threads']} | {r['fps']:.1f} | {r['latency_ms']:.0f} ms | "
                  f"{r['compute_ms']:.0f} ms | {r['dropped']:.0%} |")
    import os

    from tests.serve import ATTNVIZ_APP

    print(f"runtime {os.environ.get('ATTNVIZ_RUNTIME', 'auto')}; load average {os.getloadavg()[0]:.1f} before")
    print(f"machine: {machine.describe()}")
    for way, launcher in (("streamlit run app.py", None), ("attnviz app", ATTNVIZ_APP)):
        print(line(live_speed(args.seconds, launcher=launcher), way))


if __name__ == "__main__":
    main()
