"""The hooks attnviz keeps on a network (:class:`Tap`) and the capture they write into (:class:`Recorder`).

The hooks are installed once, when a network is wrapped (:func:`attnviz.wrap`), and stay: every forward
pass of that network calls them, at the cost of a few Python calls per layer. The model object is shared
by every browser session, so a hook writes only into the capture running on its own thread (the Tap's
``threading.local``, one per network); on any other thread, or while no capture runs, it does nothing.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

Put = Callable[["Recorder", int, Any], None]  # e.g. Recorder.put_query: (recorder, layer, value)


class Recorder:
    """One capture's store: what the hooks read during its forward pass."""

    def __init__(self, query: torch.Tensor, key: torch.Tensor, norms: torch.Tensor,
                 between_layers: Callable[[], None] | None = None) -> None:
        self.query = query  # (L, H, N, d_k)
        self.key = key  # (L, H, N, d_k)
        self.norms = norms  # (L, N)
        self.extras: dict[int, Any] = {}  # per layer: what an adapter needs after the pass (e.g. RoPE)
        self.bias: dict[int, torch.Tensor] = {}  # per layer: a logit bias that depends on the image (staged models)
        self.seen: set[tuple[str, int]] = set()
        self.between_layers = between_layers  # called after each block: a pause point (the live camera's)

    def put_query(self, layer: int, q: torch.Tensor) -> None:
        """``q``: (H, N, d_k) of the one image in the batch."""
        self.query[layer].copy_(q)  # copied out of the fused qkv buffer
        self.seen.add(("q", layer))

    def put_key(self, layer: int, k: torch.Tensor) -> None:
        self.key[layer].copy_(k)
        self.seen.add(("k", layer))

    def skip_tokens(self, layer: int) -> None:
        """Layer ``layer``'s tokens are not read (a network whose blocks attnviz does not know): its norms stay
        None. Still a pause point after the layer."""
        self.seen.add(("x", layer))
        if self.between_layers is not None:
            self.between_layers()

    def put_extra(self, layer: int, value: Any) -> None:
        self.extras[layer] = value

    def put_bias(self, layer: int, bias: torch.Tensor) -> None:
        """``bias``: (W, H, Tq, Tk) (or broadcastable) logit bias of layer ``layer`` computed from this image."""
        self.bias[layer] = bias

    def put_tokens(self, layer: int, tokens: torch.Tensor) -> None:
        """``tokens``: (N, D) residual stream after block ``layer`` ((h, w, D) in a staged model); keeps only
        each token's L2 norm, in raster order (a staged model's list of norms takes whatever count it has)."""
        norms = tokens.norm(dim=-1).reshape(-1)
        if isinstance(self.norms, list):
            self.norms[layer] = norms
        else:
            self.norms[layer].copy_(norms.reshape(self.norms[layer].shape))
        self.seen.add(("x", layer))
        if self.between_layers is not None:
            self.between_layers()


def first(output: torch.Tensor) -> torch.Tensor:
    """A module's (1, ...) output → that of the one image in the batch."""
    return output[0]


def residual(output: Any) -> torch.Tensor:
    """A block's output → the (N, D) residual stream of the one image (some blocks return a tuple)."""
    return (output[0] if isinstance(output, tuple) else output)[0]


def channels_first(output: Any) -> torch.Tensor:
    """A convolutional block's (1, C, h, w) output → the (h · w, C) tokens of the one image, in raster order."""
    out = output[0] if isinstance(output, tuple) else output
    return out[0].flatten(1).transpose(0, 1)


class Tap:
    """The hooks on one network, and which capture, if any, each thread is recording.

    Each hook is a ``partial`` of a bound method of this object, not a closure: ``copy.deepcopy(network)``
    then gives the copy hooks that write into the copy's own Tap, and a wrapped network still pickles.
    """

    def __init__(self, modules: tuple[torch.nn.Module, ...]) -> None:
        self.modules = modules  # what the hooks were installed for: attentions, then blocks
        self.handles: list = []
        self.switched: dict[int, int] = {}  # layer → its head count, where heads_off can switch its heads off
        self._local = threading.local()

    def switch(self, projection: torch.nn.Module, axis: int, layer: int, heads: int) -> None:
        """Let :meth:`heads_off` switch heads of layer ``layer`` off: ``projection`` is the module its ``heads``
        heads' outputs enter side by side along ``axis`` of its input (head h: channels h·d … (h + 1)·d − 1)."""
        self.switched[layer] = heads
        self.handles.append(projection.register_forward_pre_hook(partial(self._switch, layer, heads, axis)))

    @contextmanager
    def heads_off(self, off: dict[int, Iterable[int]]) -> Iterator[None]:
        """Inside the block, this thread's forward passes run with the heads ``off`` ({layer: heads}, 0-based)
        switched off: their slice of the attention output is zero before the output projection (Michel et al.
        2019). Other threads' passes are unchanged."""
        self.read_last()  # the switch zeroes what the projection really receives
        self._local.off = {layer: tuple(heads) for layer, heads in off.items()}
        try:
            yield
        finally:
            self._local.off = None

    def after(self, module: torch.nn.Module, layer: int, put: Put, read: Callable = first) -> None:
        """Once ``module`` has run: ``put(recorder, layer, read(output))``."""
        self.handles.append(module.register_forward_hook(partial(self._after, put, layer, read)))

    def before(self, module: torch.nn.Module, layer: int, put: Put, read: Callable) -> None:
        """When ``module`` is called: ``put(recorder, layer, read(args, kwargs))``."""
        hook = partial(self._before, put, layer, read)
        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    @property
    def current(self) -> Recorder | None:
        """The recorder of the capture running on this thread, or None."""
        return getattr(self._local, "recorder", None)

    @contextmanager
    def recording(self, recorder: Recorder) -> Iterator[None]:
        """Inside the block, this thread's forward passes of the network write into ``recorder``."""
        self.read_last()
        self._local.recorder = recorder
        try:
            yield
        finally:
            self._local.recorder = None

    def read_last(self) -> None:
        """Run attnviz's hooks after any hook added since to the same module, so that they read what the network
        computes with: a hook that changes a module's output (or its input, for a pre-hook) and ran after attnviz's
        would make the network use values attnviz did not read (a hook doubling q_norm's output: 2.7e-3 off). PyTorch
        calls a module's hooks in the order of its (ordered) dict; an observing hook sees the same values either way."""
        ours = {handle.id for handle in self.handles}
        for handle in self.handles:
            hooks = handle.hooks_dict_ref()
            if hooks is None or len(hooks) < 2 or handle.id not in hooks:
                continue
            keys = list(hooks)
            if any(key not in ours for key in keys[keys.index(handle.id) + 1:]):
                hooks.move_to_end(handle.id)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _after(self, put: Put, layer: int, read: Callable, _module, _inputs, output) -> None:
        recorder = self.current
        if recorder is not None:
            put(recorder, layer, read(output))

    def _before(self, put: Put, layer: int, read: Callable, _module, args, kwargs) -> None:
        recorder = self.current
        if recorder is not None:
            put(recorder, layer, read(args, kwargs))
        # returns None: the module runs on its arguments unchanged

    def _switch(self, layer: int, heads: int, axis: int, _module, args):
        off = getattr(self._local, "off", None)
        if not off or layer not in off:
            return None  # the projection runs on its input unchanged
        x = args[0].clone()
        d = x.shape[axis] // heads
        for head in off[layer]:
            x.narrow(axis, head * d, d).zero_()
        return (x, *args[1:])

    # A copy (deepcopy, pickle) starts with no capture running on any thread.
    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
