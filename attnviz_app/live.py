"""The "Live camera" photo source: the camera's video comes back with the class token's heatmap.

Streamlit wiring only. streamlit-webrtc carries the video between the browser and this server (WebRTC);
every frame goes through :class:`attnviz.live.LiveProcessor`, one per browser session, whose settings
are swapped whole on each script run. Freeze keeps the newest frame as PNG bytes, which then take the
same path as an upload. Imported only when someone picks the live camera, so the still-photo path
never loads WebRTC.

The server runs at most ``ATTNVIZ_LIVE_STREAMS`` streams at once (one :class:`attnviz.live.StreamSlots`
for every session): a visitor over the cap is told so, and their page offers Start again as soon as a
stream ends. Live frames wait while a visitor's photo is decoded and captured, take turns, and run at
the lowest OS priority (attnviz.live_sharing), so uploads go first.
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
from attnviz import render, serving
from attnviz.softmax import HEAD_FUSIONS
from attnviz.live import LiveProcessor, LiveSettings
from attnviz.live_sharing import Priority, StreamSlots
from .priority import priority
from .settings import Settings
from .text import t

STREAM_KEY = "live_stream"
FROZEN_KEY = "live_frozen"  # (png bytes, file name, time) of the frame Freeze kept
STOP_KEY = "live_stop"  # set by Freeze: the next run asks the browser to stop the stream
AWAY_KEY = "live_turned_away"  # set when a stream found every slot taken: the next run says so
ICE_ENV = "ATTNVIZ_ICE_SERVERS"
DISPLAY_PX = 392  # the picture sent back: 2 × 196, each patch a crisp block
FRAME_RATE = 20  # camera frames per second asked for: more than the model keeps up with on a CPU
CAMERA_HEIGHTS = (240, 480, 720)  # the smallest at least the model's input size is asked for
LIVE_NICE = 19  # the threads computing live frames run at the lowest OS priority
SLOT_POLL_S = 2.0  # how often a turned-away page looks for a free slot
# How often the speed line under the video is redrawn. Every redraw is a script run of its own, after which
# Streamlit collects all the garbage of the process (runner.postScriptGC) while holding the GIL: ~20 ms
# in which the event loop carries no one's upload. 2 s halves what 1 s cost; the rate is a 3 s average.
SPEED_EVERY_S = 2.0


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
    """The heatmap as a video frame, already in the encoder's pixel format: converted once per heatmap
    here, not once per frame sent (the newest heatmap goes out with every camera frame)."""
    return av.VideoFrame.from_image(picture).reformat(format="yuv420p")


def _session_alive(session_id: str) -> bool:
    from streamlit.runtime import Runtime

    return not Runtime.exists() or Runtime.instance().is_active_session(session_id)


@st.cache_resource(show_spinner=False, max_entries=2)
def shared_slots(limit: int) -> StreamSlots:
    """The server's one set of stream slots (one per limit, should the owner's setting change)."""
    return StreamSlots(limit, alive=_session_alive)


def slots() -> StreamSlots:
    return shared_slots(serving.policy().live_streams)  # a bad setting already stopped the page's sidebar


def make_processor(shared: StreamSlots, owner: str, first: LiveSettings, order: Priority) -> LiveProcessor:
    """The stream's processor, holding one of the server's slots; over the cap, one that computes nothing
    and sends the dark placeholder (the page then says why and stops it). Called on streamlit-webrtc's
    thread, so everything it needs from the session is handed in."""
    dark = placeholder(first.model)
    made = shared.open(owner, lambda: LiveProcessor(
        first, encode=to_video_frame, placeholder=dark, nice=LIVE_NICE, priority=order,
        workers=order.alone,  # a lone stream may use a turn per core
    ))
    return made or LiveProcessor(first, encode=to_video_frame, placeholder=dark, workers=0)


def _session_id() -> str:
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else ""


@st.fragment(run_every=SLOT_POLL_S)
def wait_for_a_slot() -> None:
    """While every slot is taken: look again now and then, and bring back Start once one is free."""
    if slots().free() > 0:
        st.rerun(scope="app")


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


def layer_name(model: attnviz.Model, layer: int) -> str:
    """Layer ``layer`` (1-based) as the page names it: "Stage 2, block 1" in a model with stages."""
    layouts = model.adapter.layouts
    if layouts is None:
        return t("live.layer_n", n=layer)
    lay = layouts[layer - 1]
    return t("stages.live_layer", stage=lay.stage + 1, block=lay.block + 1)


def layer_and_head(model: attnviz.Model) -> None:
    """The page's Layer and Head controls (same keys as the views'), drawn here while the stream runs; in a
    model with stages the Layer runs through every (stage, block), and the Head list is that layer's."""
    layouts = model.adapter.layouts
    if st.session_state.get("layer", 0) > model.depth:
        st.session_state.pop("layer", None)
    chosen = st.session_state.get("layer", model.depth)
    count = model.num_heads if layouts is None else layouts[chosen - 1].num_heads
    heads = [*HEAD_FUSIONS, *range(1, count + 1)]
    if st.session_state.get("head", "mean") not in heads:
        st.session_state.pop("head", None)
    st.session_state.setdefault("layer", model.depth)  # its first value, not the widget's (ui.first_value says why)
    if layouts is None:
        st.slider(t("view.layer"), 1, model.depth, key="layer")
    else:
        st.select_slider(t("view.layer"), list(range(1, model.depth + 1)), key="layer",
                         format_func=lambda n: layer_name(model, n))
    st.selectbox(
        t("view.head"), heads, key="head",
        format_func=lambda h: t(f"view.head_{h}") if isinstance(h, str) else str(h), placeholder=t("classroom.choose"),
    )


@st.fragment(run_every=SPEED_EVERY_S)
def speed_line() -> None:
    live = processor()
    if live is None:
        return
    if not slots().holds(live):  # turned away, or its slot was taken back: the whole page says so
        st.session_state[AWAY_KEY] = st.session_state[STOP_KEY] = True
        st.rerun(scope="app")
    if live.error is not None:
        st.warning(t("live.frame_error", reason=str(live.error).splitlines()[0][:200]))
    stats, latest = live.stats(), live.latest
    if latest is not None and not math.isnan(stats.fps) and not math.isnan(stats.latency_ms):
        head = latest.settings.head
        head = t(f"view.head_{head}") if isinstance(head, str) else t("view.head_n", n=head + 1)
        layer = layer_name(latest.settings.model, latest.settings.layer + 1)
        st.caption(t("live.speed", layer=layer, head=head, fps=stats.fps, ms=stats.latency_ms))
    else:
        st.caption(t("live.waiting_frames"))


PROBE_JS = r"""
export default function ({ setStateValue }) {
  // What went wrong with the camera, in a word the page turns into a sentence in the reader's language.
  // streamlit-webrtc shows its errors in English inside its frame; they are read (and hidden) here.
  let last = "";  // the default the page starts from: report only a change, so a healthy page never reruns
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
    context = st.session_state.get(STREAM_KEY)
    streaming = context is not None and (context.state.playing or context.state.signalling)
    problem = _probe(key="live_probe", default={"problem": ""}, on_problem_change=lambda: None, height=0).problem
    if problem in ("insecure", "no_webrtc"):
        st.warning(t(f"live.problem_{problem}"))
        return _frozen(hint=False)

    stop_now = st.session_state.pop(STOP_KEY, False)
    turned_away = st.session_state.pop(AWAY_KEY, False)
    shared = slots()
    own = context.video_processor if context is not None else None  # a stopped stream not yet torn down
    # All others' streams. A visitor turned away whose stream has already ended is told here too: drawing the stopped
    # camera again would leave it, and its Start, on the page until something else reran it.
    if not streaming and (turned_away or not stop_now) and shared.free() <= 0 and not shared.holds(own):
        st.info(t("live.full", streams=shared.limit) if shared.limit else t("live.off"))
        if shared.limit:
            wait_for_a_slot()
        return _frozen(hint=False)

    # the same two columns whether or not the stream runs: moving the component would restart it
    video, side = st.columns([3, 2], gap="medium")
    if streaming and not turned_away:
        with side:
            layer_and_head(model)
    # read here, on the page's thread: the processor is made on streamlit-webrtc's
    owner, first, order = _session_id(), live_settings(model, settings), priority()
    with video:
        try:
            context = webrtc_streamer(
                key=STREAM_KEY,
                mode=WebRtcMode.SENDRECV,
                rtc_configuration={"iceServers": ice_servers()},
                media_stream_constraints={"video": camera_constraints(model), "audio": False},
                video_processor_factory=lambda: make_processor(shared, owner, first, order),
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
    running = context.state.playing or context.state.signalling
    if live is not None and running and not stop_now and not shared.holds(live):
        # the stream started while every slot was taken (another visitor pressed Start first): stop it
        st.session_state[AWAY_KEY] = st.session_state[STOP_KEY] = True
        st.rerun()
    if live is not None:
        live.settings = live_settings(model, settings)  # one reference swap: the next frame uses it
    with side:
        if turned_away:
            st.warning(t("live.full", streams=shared.limit) if shared.limit else t("live.off"))
            return _frozen(hint=False)
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
