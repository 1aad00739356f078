"""The "Live camera" photo source: the camera's video comes back with the class token's heatmap.

Streamlit wiring only. streamlit-webrtc carries the video between the browser and this server (WebRTC);
every frame goes through :class:`attnviz.live.LiveProcessor`, one per browser session, whose settings
are swapped whole on each script run. Freeze keeps the newest frame as PNG bytes, which then take the
same path as an upload. Imported only when someone picks the live camera, so the still-photo path
never loads WebRTC.
"""
from __future__ import annotations

import io
import json
import math
import os
import time

import av
import streamlit as st
from PIL import Image
from streamlit_webrtc import WebRtcMode, webrtc_streamer

import attnviz
from attnviz import render
from attnviz.capture import HEAD_FUSIONS
from attnviz.live import LiveProcessor, LiveSettings
from .settings import Settings
from .text import t

STREAM_KEY = "live_stream"
FROZEN_KEY = "live_frozen"  # (png bytes, file name, time) of the frame Freeze kept
STOP_KEY = "live_stop"  # set by Freeze: the next run asks the browser to stop the stream
ICE_ENV = "ATTNVIZ_ICE_SERVERS"
DISPLAY_PX = 392  # the picture sent back: 2 × 196, each patch a crisp block
FRAME_RATE = 20  # camera frames per second asked for: more than the model keeps up with on a CPU
CAMERA_HEIGHTS = (240, 480, 720)  # the smallest at least the model's input size is asked for


def parse_ice_servers(raw) -> list[dict]:
    """ICE servers from JSON text or a TOML list: ``[{"urls": "turn:host:3478", "username": …}, …]``."""
    servers = json.loads(raw) if isinstance(raw, str) else raw
    if isinstance(servers, dict):
        servers = [servers]
    if not isinstance(servers, list) or not all(isinstance(s, dict) and "urls" in s for s in servers):
        raise ValueError('expected a list like [{"urls": "stun:host:3478"}]')
    return [{k: (list(v) if not isinstance(v, str) else v) for k, v in dict(s).items()} for s in servers]


def ice_servers() -> list[dict]:
    """None by default: on localhost and a classroom network the browser and server reach each other
    directly. For other networks: the ATTNVIZ_ICE_SERVERS environment variable (JSON) or
    ``ice_servers`` in ``.streamlit/secrets.toml``."""
    raw = os.environ.get(ICE_ENV)
    if raw is None:
        try:
            raw = st.secrets.get("ice_servers")
        except Exception:  # no secrets file: nothing configured
            raw = None
    if raw is None:
        return []
    try:
        return parse_ice_servers(raw)
    except (ValueError, TypeError) as e:
        st.warning(t("live.ice_error", reason=str(e).splitlines()[0]))
        return []


def live_settings(model: attnviz.Model, settings: Settings) -> LiveSettings:
    """What the stream draws: the page's own Layer, Head, opacity, colour map and smoothing."""
    state = st.session_state
    layer = state.get("layer", model.depth)
    head = state.get("head", "mean")
    return LiveSettings(
        model, layer=min(layer, model.depth) - 1, head=head if isinstance(head, str) else head - 1,
        alpha=state.get("alpha", 0.6), cmap=state.get("cmap", "inferno"), smooth=state.get("smooth", False),
        fit=settings.fit, display=DISPLAY_PX,
    )


def camera_constraints(model: attnviz.Model) -> dict:
    """Ask for a picture just large enough for the model: decoding and encoding video costs CPU time the
    model needs (a 640 × 480 stream takes four times a 320 × 240 one, for the same 196 px input)."""
    height = next((h for h in CAMERA_HEIGHTS if h >= model.size), CAMERA_HEIGHTS[-1])
    return {"width": {"ideal": height * 4 // 3}, "height": {"ideal": height}, "frameRate": {"ideal": FRAME_RATE}}


def placeholder(model: attnviz.Model) -> av.VideoFrame:
    """A dark square the size of the heatmaps, sent until the first one is ready (not the raw camera)."""
    return to_video_frame(render.enlarge(Image.new("RGB", (model.size, model.size), (14, 17, 23)), DISPLAY_PX))


def to_video_frame(picture) -> av.VideoFrame:
    return av.VideoFrame.from_image(picture)


def processor() -> LiveProcessor | None:
    context = st.session_state.get(STREAM_KEY)
    return context.video_processor if context is not None else None


def freeze() -> None:
    """Keep the frame whose heatmap is on screen, losslessly, and stop the stream."""
    live = processor().latest if processor() is not None else None
    if live is None:
        return
    buffer = io.BytesIO()
    live.image.save(buffer, format="PNG")
    now = time.strftime("%H:%M:%S")
    st.session_state[FROZEN_KEY] = (buffer.getvalue(), f"live-{now.replace(':', '')}.png", now)
    st.session_state[STOP_KEY] = True


def layer_and_head(model: attnviz.Model) -> None:
    """The page's Layer and Head controls (same keys as the views'), drawn here while the stream runs."""
    heads = [*HEAD_FUSIONS, *range(1, model.num_heads + 1)]
    if st.session_state.get("layer", 0) > model.depth or st.session_state.get("head", "mean") not in heads:
        st.session_state.pop("layer", None)
        st.session_state.pop("head", None)
    st.slider(t("view.layer"), 1, model.depth, model.depth, key="layer")
    st.selectbox(
        t("view.head"), heads, key="head",
        format_func=lambda h: t(f"view.head_{h}") if isinstance(h, str) else str(h),
    )


@st.fragment(run_every=1.0)
def speed_line() -> None:
    live = processor()
    if live is None:
        return
    if live.error is not None:
        st.warning(t("live.frame_error", reason=str(live.error).splitlines()[0][:200]))
    stats, latest = live.stats(), live.latest
    if latest is not None and not math.isnan(stats.fps) and not math.isnan(stats.latency_ms):
        head = latest.settings.head
        head = t(f"view.head_{head}") if isinstance(head, str) else t("view.head_n", n=head + 1)
        st.caption(t("live.speed", layer=latest.settings.layer + 1, head=head, fps=stats.fps, ms=stats.latency_ms))
    else:
        st.caption(t("live.waiting_frames"))


PROBE_JS = r"""
export default function ({ setStateValue }) {
  // What went wrong with the camera, in a word the page turns into a sentence in the reader's language.
  // streamlit-webrtc shows its errors in English inside its frame; they are read (and hidden) here.
  let last = null;
  const report = (problem) => { if (problem !== last) { last = problem; setStateValue("problem", problem); } };
  const classify = (text) => {
    if (!text) return "";
    if (/NotAllowedError|SecurityError|Permission denied|PermissionDenied/i.test(text)) return "denied";
    if (/NotFoundError|DevicesNotFound|OverconstrainedError|Requested device not found/i.test(text)) return "no_camera";
    if (/NotReadableError|TrackStartError|AbortError|Could not start/i.test(text)) return "busy";
    if (/mediaDevices is undefined|getUserMedia is not implemented|not loaded securely/i.test(text)) return "insecure";
    if (/taking longer than expected|ICE connection|connection failed/i.test(text)) return "connect";
    return "failed";
  };
  const check = () => {
    if (!window.isSecureContext || !navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) return report("insecure");
    if (typeof RTCPeerConnection === "undefined") return report("no_webrtc");
    const frame = [...document.querySelectorAll("iframe")].find((f) => /webrtc/i.test(f.title || f.src || ""));
    let doc = null;
    try { doc = frame && frame.contentDocument; } catch (e) { doc = null; }
    if (!doc || !doc.head) return;
    if (!doc.getElementById("attnviz-quiet")) {
      const style = doc.createElement("style");
      style.id = "attnviz-quiet";
      style.textContent = '[role="alert"] { display: none !important; }';
      doc.head.appendChild(style);
    }
    const text = [...doc.querySelectorAll('[role="alert"]')].map((a) => a.textContent).join(" ");
    report(classify(text));
  };
  check();
  const timer = setInterval(check, 400);
  return () => clearInterval(timer);
}
"""
_probe = st.components.v2.component("attnviz_camera_probe", js=PROBE_JS)


def live_source(model: attnviz.Model, settings: Settings) -> tuple[bytes, str] | None:
    """Draw the live camera; return the frozen frame (PNG bytes, name) once Freeze was pressed and the
    stream is stopped. While the stream runs, the page stops here (its views need a still photo)."""
    if model.adapter.layouts is not None:  # issue #22: the stream draws one grid throughout
        st.info(t("stages.no_live", model=model.public_name))
        return None
    context = st.session_state.get(STREAM_KEY)
    streaming = context is not None and (context.state.playing or context.state.signalling)
    problem = _probe(key="live_probe", default={"problem": ""}, on_problem_change=lambda: None, height=0).problem
    if problem in ("insecure", "no_webrtc"):
        st.warning(t(f"live.problem_{problem}"))
        return _frozen(hint=False)

    # the same two columns whether or not the stream runs: moving the component would restart it
    video, side = st.columns([3, 2], gap="medium")
    if streaming:
        with side:
            layer_and_head(model)
    stop_now = st.session_state.pop(STOP_KEY, False)
    with video:
        try:
            context = webrtc_streamer(
                key=STREAM_KEY,
                mode=WebRtcMode.SENDRECV,
                rtc_configuration={"iceServers": ice_servers()},
                media_stream_constraints={"video": camera_constraints(model), "audio": False},
                video_processor_factory=lambda: LiveProcessor(
                    live_settings(model, settings), encode=to_video_frame, placeholder=placeholder(model)
                ),
                async_processing=False,  # LiveProcessor has its own newest-frame worker; recv never blocks
                desired_playing_state=False if stop_now else None,
                video_html_attrs={
                    "autoPlay": True, "controls": False, "muted": True, "playsInline": True,
                    # square from the start, so the component's frame is sized for the heatmap, not the camera
                    "style": {"width": "100%", "maxWidth": f"{DISPLAY_PX * 3 // 2}px", "aspectRatio": "1 / 1",
                              "imageRendering": "pixelated"},
                },
                translations={key: t(f"live.{key}") for key in (
                    "start", "stop", "select_device", "device_ask_permission", "device_not_available",
                    "device_access_denied", "media_api_not_available", "turn_camera_on", "turn_camera_off",
                    "select_camera",
                )},
            )
        except Exception:  # e.g. signalling timed out: one sentence, never a traceback
            with side:
                st.warning(t("live.problem_connect"))
                return _frozen(hint=False)
    live = context.video_processor
    if live is not None:
        live.settings = live_settings(model, settings)  # one reference swap: the next frame uses it
    with side:
        if problem:
            st.warning(t(f"live.problem_{problem}"))
        if context.state.playing or context.state.signalling:
            st.button(t("live.freeze"), help=t("live.freeze_help"), on_click=freeze, type="primary", key="live_freeze")
            speed_line()
            st.info(t("live.streaming"))
            st.stop()
        return _frozen(hint=not problem)


def _frozen(hint: bool = True) -> tuple[bytes, str] | None:
    """The kept frame, or a stop (with how to start, unless a problem was just explained)."""
    kept = st.session_state.get(FROZEN_KEY)
    if kept is None:
        if hint:
            st.info(t("live.press_start"))
        st.stop()
    data, name, when = kept
    st.caption(t("live.frozen", time=when))
    return data, name
