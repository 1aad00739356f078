"""Any PyTorch vision transformer no family claims: its attention read where PyTorch computes it.

Most vision transformers written today hand their attention to one of two PyTorch functions:
``F.scaled_dot_product_attention`` (SDPA: hand-written ViTs, Hugging Face's ``attn_implementation="sdpa"``)
or ``nn.MultiheadAttention`` (torchvision's ``vit_b_16``, SigLIP's pooling head). Whatever the model, the
exact logits are the arguments of that call: softmax(q · kᵀ · scale + mask). So while a capture's forward
pass runs, :class:`Intercept` (a ``TorchFunctionMode``, which PyTorch keeps per thread) sees every such call
and hands what it received to the capture: q, k (each key head repeated for its group of query heads under
``enable_gqa``), the scale, and the mask as an additive bias (a boolean mask and ``is_causal`` become −∞
where a key is not allowed, as SDPA's reference implementation does). The model itself runs unchanged.

Inside ``nn.MultiheadAttention`` the call is ``F.multi_head_attention_forward``: its own SDPA call
(``need_weights=False``) or, when the module returns its weights, its first ``bmm``/``baddbmm``
(q · d_k^−½ times kᵀ, plus the mask) is what is read, so the projections, the merged masks and the scale are
the module's own arithmetic, not a copy of it. (A ``TorchFunctionMode`` also turns the module's fused fast
path off for the pass: the slow path computes the same attention.)

Which tokens a call's rows are comes from the model's structure where that is unambiguous: the patch
embedding (the one ``Conv2d`` over the image whose kernel is its stride) gives the grid, and the tokens before
it must be the class, distillation and register tokens the model has parameters for. Otherwise the caller
says (``attnviz.wrap(net, …, grid=(h, w), prefix=k)``), and is told so in one sentence.

A call whose batch is one image's windows (Hugging Face's ``SwinModel``: ``SwinLayer`` pads its (h, w) feature
map to whole windows, rolls it by −shift and hands every window of it to one SDPA call) is placed on the image
by the module that made it: one with ``window_size`` and ``shift_size`` whose ``forward`` takes
``input_dimensions``. While the probe runs, such a module's (h, w) and its window and shift as they are when the
call is made (after ``set_shift_and_window_size`` clamps them) give the layer the layout timm's Swin has
(:func:`attnviz.stages.window_partition_index`: windows in row-major order of the rolled map, rows in row-major
order inside each). That the call is this partition is checked where it can be: as many batch rows as windows,
T = window² rows each, and under a shift, the mask between the regions the roll joined. The convention is
Hugging Face's ``SwinLayer`` (its Donut and MaskFormer copies take their softmax by hand in this transformers, and
are refused as such); a module with those attributes that partitions otherwise would be misplaced, which is why
the mask is checked. A map that would need padding is
refused (the padded tokens are keys the model attends to but no patch of the photo).

What this path does not read (attention computed by hand, other calls per image over several windows, fewer
calls than the model has attention modules) is refused in one sentence, never half-read.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..errors import ModelError
from ..stages import LayerLayout, global_layout, window_partition_index
from .base import Adapter, check_windows
from .registry import Family, register
from .tap import Recorder

SDPA = F.scaled_dot_product_attention
MHA_FORWARD = F.multi_head_attention_forward
MHA_SIGNATURE = inspect.signature(MHA_FORWARD)
CLASS_TOKENS = ("cls_token", "class_token", "class_embedding", "cls_embedding")  # a parameter's last name
OTHER_PREFIX = ("dist_token", "register_tokens", "reg_token")  # distillation and register tokens
SOFTMAXES = (torch.softmax, F.softmax, torch.Tensor.softmax, torch.nn.functional.log_softmax)


@dataclass(frozen=True, eq=False)
class Call:
    """One attention call as PyTorch received it: its weights are softmax(query · keyᵀ · scale + bias)."""

    query: torch.Tensor  # (B, H, Lq, d_k)
    key: torch.Tensor  # (B, H, Lk, d_k): with enable_gqa, each key head repeated for its query heads
    bias: torch.Tensor | None  # (B | 1, H | 1, Lq, Lk) additive: the mask, −∞ where a key is not allowed
    scale: float
    dropout: float
    where: str  # "scaled_dot_product_attention" or "nn.MultiheadAttention"


def _four(t: torch.Tensor) -> torch.Tensor:
    """(..., L, S) → (B, H, L, S): the batch and head axes an SDPA argument may leave out."""
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t.reshape(-1, *t.shape[-3:])


def sdpa_call(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False) -> Call:
    """What ``F.scaled_dot_product_attention`` computes, from its arguments (PyTorch's reference formula)."""
    q, k = _four(query), _four(key)
    if enable_gqa and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    lq, lk = q.shape[-2], k.shape[-2]
    bias = None
    if is_causal:  # top-left aligned, as SDPA's reference: query i sees keys 0 … i
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
        bias = torch.zeros(lq, lk, dtype=q.dtype, device=q.device).masked_fill(~allowed, -math.inf)[None, None]
    if attn_mask is not None:
        mask = attn_mask
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=mask.device).masked_fill(~mask, -math.inf)
        mask = _four(mask)
        bias = mask if bias is None else bias + mask
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return Call(q, k, bias, scale, float(dropout_p), "scaled_dot_product_attention")


def bmm_call(func, batch: int, heads: int, args: tuple, kwargs: dict) -> Call:
    """The first ``bmm`` / ``baddbmm`` of ``F.multi_head_attention_forward`` with ``need_weights=True``:
    (q · d_k^−½) @ kᵀ over (B · H, L, d_k), the mask (B · H | 1, L, S) added by ``baddbmm``."""
    names = ("input", "batch1", "batch2") if func is torch.baddbmm else ("input", "mat2")
    given = dict(zip(names, args), **kwargs)
    if func is torch.baddbmm:
        mask, q, kt = given["input"], given["batch1"], given["batch2"]
    else:
        mask, q, kt = None, given["input"], given["mat2"]
    lq, d = q.shape[-2:]
    q = q.reshape(batch, heads, lq, d)
    k = kt.transpose(-2, -1).reshape(batch, heads, -1, d)
    bias = None
    if mask is not None:  # (B · H, L, S) per head and image, or (1, L, S) shared
        bias = mask.reshape(batch, heads, *mask.shape[-2:]) if mask.shape[0] == batch * heads \
            else mask.reshape(1, 1, *mask.shape[-2:])
    return Call(q, k, bias, 1.0, 0.0, "nn.MultiheadAttention")


class Intercept(TorchFunctionMode):
    """Inside ``with``, on this thread only (PyTorch keeps its function modes per thread): every attention call
    the forward pass makes is handed to ``sink`` as a :class:`Call`, then computed as it would have been."""

    def __init__(self, sink: Callable[[Call], None], inside: tuple[int, int] | None = None,
                 by_hand: list | None = None) -> None:
        super().__init__()
        self.sink = sink
        self.inside = inside  # inside F.multi_head_attention_forward: (batch, heads); read its first attention only
        self.done = False
        self.by_hand = by_hand  # when given (at wrap time): the shapes of softmaxes over tokens the model takes itself

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.inside is None and func is MHA_FORWARD:
            bound = MHA_SIGNATURE.bind(*args, **kwargs)
            query, heads = bound.arguments["query"], bound.arguments["num_heads"]
            inner = Intercept(self.sink, (query.shape[1] if query.dim() == 3 else 1, int(heads)))
            with inner:  # this mode is off while its handler runs: the inner one sees the module's own arithmetic
                out = torch.overrides.redispatch_function(func, types, args, kwargs)  # its body, this hop skipped
            if not inner.done:
                raise RuntimeError("nn.MultiheadAttention computed its attention in a way attnviz did not see")
            return out
        if not self.done and func is SDPA:
            self.sink(sdpa_call(*args, **kwargs))
            self.done = self.inside is not None
        elif self.inside is not None and not self.done and func in (torch.bmm, torch.baddbmm):
            self.sink(bmm_call(func, *self.inside, args, kwargs))
            self.done = True
        elif self.by_hand is not None and func in SOFTMAXES and args and getattr(args[0], "dim", lambda: 0)() >= 3:
            self.by_hand.append(tuple(args[0].shape))  # (…, L, S): attention weights made by hand, not a classifier's
        return func(*args, **kwargs)


# ---- where a windowed module's call lies on the image ----------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """The windowed module a call was made in, as it was at that moment: its (h, w) token grid
    (``input_dimensions``), its window side and its cyclic shift."""

    grid: tuple[int, int]
    window: int
    shift: int


def windowed_modules(network: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that attend in shifted windows as Hugging Face's ``SwinLayer`` does: ``window_size`` and
    ``shift_size`` whole numbers, and a ``forward`` that takes the grid as ``input_dimensions``."""
    def windowed(m: torch.nn.Module) -> bool:
        sizes = (getattr(m, "window_size", None), getattr(m, "shift_size", None))
        return (all(isinstance(v, int) and not isinstance(v, bool) for v in sizes)
                and "input_dimensions" in inspect.signature(m.forward).parameters)

    return [m for m in network.modules() if windowed(m)]


@contextmanager
def placements(network: torch.nn.Module) -> Iterator[Callable[[], Placement | None]]:
    """Inside ``with``, on this thread only: yields a function that gives the :class:`Placement` of the innermost
    windowed module running now, None outside every one. Its window and shift are read when asked (at the call),
    after the module has clamped them to its grid."""
    running: list[tuple[torch.nn.Module, tuple[int, int]]] = []
    thread = threading.get_ident()

    def enter(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if threading.get_ident() == thread:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            running.append((module, bound.arguments["input_dimensions"]))

    def leave(module: torch.nn.Module, args: tuple, output) -> None:
        if threading.get_ident() == thread and running:
            running.pop()

    def now() -> Placement | None:
        if not running:
            return None
        module, (h, w) = running[-1]
        return Placement((int(h), int(w)), int(module.window_size), int(module.shift_size))

    handles = []
    for m in windowed_modules(network):
        handles += [m.register_forward_pre_hook(enter, with_kwargs=True), m.register_forward_hook(leave)]
    try:
        yield now
    finally:
        for handle in handles:
            handle.remove()


def shift_regions(windows: torch.Tensor, grid: tuple[int, int], window: int, shift: int) -> torch.Tensor:
    """(W, T): the region of each window row on the rolled map, 3 per axis as Swin's mask counts them
    (``[0, n − window)``, ``[n − window, n − shift)``, ``[n − shift, n)``): tokens of two regions were joined by
    the roll from opposite edges of the image."""
    def region(position: torch.Tensor, n: int) -> torch.Tensor:
        rolled = (position - shift) % n  # torch.roll(x, −shift): position p lands at p − shift
        return (rolled >= n - window).long() + (rolled >= n - shift).long()

    return region(windows // grid[1], grid[0]) * 3 + region(windows % grid[1], grid[1])


def masks_the_shift(call: Call, regions: torch.Tensor) -> bool:
    """Whether the call's bias is lowered (by more than 1) exactly between tokens of different regions, relative to
    window 0, which the roll leaves whole."""
    joined = regions[:, :, None] != regions[:, None, :]  # (W, T, T)
    if call.bias is None or call.bias.shape[0] != regions.shape[0] or joined[0].any():
        return False
    lowered = (call.bias - call.bias[:1]) < -1.0  # (W, H | 1, T, T)
    return bool((lowered == joined[:, None].to(lowered.device)).all())


def windowed_layout(net: str, size: int, layer: int, call: Call, place: Placement) -> LayerLayout:
    """The layout of a call over one image's windows, from where its module says they lie; or one sentence."""
    batch, heads, lq, d = call.query.shape
    (h, w), side, shift = place.grid, place.window, place.shift
    check_windows(net, size, f"attention call {layer + 1}", (h, w), (side, side))  # padding: not photo patches
    if size % h or size % w or size // h != size // w:
        raise ModelError(f"At {size} px, {net}'s attention call {layer + 1} is over a {h} × {w} token grid, which does "
                         f"not cut the {size} × {size} px input into square patches, so attnviz refuses that size.")
    windows = window_partition_index((h, w), (side, side), (shift, shift))  # (W, T)
    if (batch, lq, call.key.shape[-2]) != (windows.shape[0], side * side, side * side):
        raise ModelError(f"{net} computes its attention call {layer + 1} over {batch} windows of {lq} tokens per "
                         f"image, which are not the {windows.shape[0]} windows of {side * side} tokens of its "
                         f"{h} × {w} grid, so attnviz refuses it rather than guess where they lie.")
    if shift and not masks_the_shift(call, shift_regions(windows, (h, w), side, shift)):
        raise ModelError(f"{net}'s attention call {layer + 1} is over windows of a {h} × {w} grid shifted by {shift}, "
                         "but its mask does not separate the regions that shift joins as Swin's does, so attnviz "
                         "cannot tell where its windows lie and refuses it rather than guess.")
    return LayerLayout(stage=0, block=0, grid=(h, w), patch=size // h, window=(side, side), shift=(shift, shift),
                       num_heads=heads, head_dim=d, scale=call.scale, windows=windows)


# ---- the token layout of each call -------------------------------------------------------------------


LIBRARIES = {"torchvision": "torchvision's", "transformers": "Hugging Face's"}


def _name(network: torch.nn.Module) -> str:
    """``torchvision's SwinTransformer``, ``Hugging Face's SiglipVisionModel``; a model of one's own by its class."""
    library = LIBRARIES.get(type(network).__module__.split(".")[0])
    return f"{library} {type(network).__name__}" if library else type(network).__name__


def patch_embedding(network: torch.nn.Module, channels: int = 3) -> int | None:
    """The stride of the network's patch embedding: the ``Conv2d`` over the image's channels whose kernel is its
    stride (more than 1 px); None when there is none, or several that disagree."""
    strides = {m.stride for m in network.modules() if isinstance(m, torch.nn.Conv2d) and m.in_channels == channels
               and tuple(m.kernel_size) == tuple(m.stride) and m.stride[0] == m.stride[1] and m.stride[0] > 1}
    return next(iter(strides))[0] if len(strides) == 1 else None


def prefix_parameters(network: torch.nn.Module) -> tuple[int, bool]:
    """(tokens before the patches the network has parameters for, whether one is a class token)."""
    count, class_token = 0, False
    for name, p in network.named_parameters():
        last = name.rsplit(".", 1)[-1]
        if last in CLASS_TOKENS or last in OTHER_PREFIX:
            count += p.shape[-2] if p.dim() >= 2 else 1
            class_token = class_token or last in CLASS_TOKENS
    return count, class_token


def attention_modules(network: torch.nn.Module) -> list[torch.nn.Module]:
    """The innermost modules that are attention by their class (``nn.MultiheadAttention``, ``…Attention``,
    ``…Attn``): one per attention layer in the models this path reads."""
    def named(m: torch.nn.Module) -> bool:
        name = type(m).__name__
        return isinstance(m, torch.nn.MultiheadAttention) or "attention" in name.lower() or name.endswith("Attn")

    found = [m for m in network.modules() if named(m)]
    return [m for m in found if not any(named(c) for c in m.modules() if c is not m)]


def layouts_of(network: torch.nn.Module, size: int, calls: list[Call], grid: tuple[int, int] | None,
               prefix: int | None, where: list[Placement | None] | None = None
               ) -> tuple[tuple[LayerLayout, ...], bool]:
    """Each call's :class:`LayerLayout` at S × S inputs, and whether token 0 is a class token; or one sentence.
    ``where``: per call, the windowed module it was made in (:func:`placements`), or None."""
    net = _name(network)
    if grid is None:
        patch = patch_embedding(network)
        if patch is None:
            raise ModelError(f"attnviz cannot tell which image patch each of {net}'s tokens is (it has no single "
                             "convolution over the image whose kernel is its stride); pass grid=(rows, columns) to "
                             "attnviz.wrap.")
        if size % patch:
            raise ModelError(f"The input size must be a multiple of {net}'s {patch} px patches; {size} px is not.")
        grid = (size // patch, size // patch)
    grid = (int(grid[0]), int(grid[1]))
    if grid[0] <= 0 or grid[1] <= 0 or size % grid[0] or size % grid[1] or grid[0] != grid[1]:
        raise ModelError(f"grid={grid} does not cut a {size} × {size} px input into square patches.")
    patch, cells = size // grid[1], grid[0] * grid[1]
    counted, class_token = prefix_parameters(network)
    expected = counted if prefix is None else int(prefix)
    class_token = class_token and expected > 0
    layouts, stage, block, previous = [], -1, 0, None
    where = where or [None] * len(calls)
    for layer, (call, place) in enumerate(zip(calls, where)):
        batch, heads, lq, d = call.query.shape
        lk = call.key.shape[-2]
        if call.dropout > 0:
            raise ModelError(f"{net} calls {call.where} with dropout {call.dropout:g} in eval mode, so its attention "
                             "is random on every pass and attnviz refuses it rather than show one draw.")
        if place is not None:  # the windows of one image, placed by the module that made the call
            if expected:
                raise ModelError(f"{net}'s attention call {layer + 1} is over windows of its token grid, which hold "
                                 f"no prefix tokens, so attnviz cannot read it with {expected} prefix tokens.")
            shape = ("windows", place.grid, heads, d, call.scale)
            if shape != previous:
                stage, block, previous = stage + 1, 0, shape
            layouts.append(_at(windowed_layout(net, size, layer, call, place), stage, block))
            block += 1
            continue
        if batch != 1:
            raise ModelError(f"{net} computes its attention call {layer + 1} over {batch} windows of {lq} tokens per "
                             "image, whose places on the image the generic path does not infer, so attnviz refuses it "
                             "rather than guess them.")
        key_prefix = lk - cells
        if key_prefix != expected:
            hint = (f"{expected} prefix tokens ({'its class and register token parameters' if prefix is None else 'prefix='})"
                    f" and a {grid[0]} × {grid[1]} grid")
            raise ModelError(f"{net}'s attention call {layer + 1} has {lk} keys, which are not {hint}, so attnviz "
                             "cannot tell which token is which; pass grid=(rows, columns) and prefix=k (the tokens "
                             "before the patches) to attnviz.wrap.")
        shape = (lq, lk, heads, d, call.scale)
        if shape != previous:
            stage, block, previous = stage + 1, 0, shape
        if lq == lk:  # self-attention over the tokens: one window of every token
            lay = global_layout(block, grid, patch, heads, d, call.scale, expected, class_token)
        else:  # queries of their own (a pooling probe) over the tokens
            lay = LayerLayout(stage=0, block=block, grid=grid, patch=patch, window=grid, shift=(0, 0),
                              num_heads=heads, head_dim=d, scale=call.scale, windows=torch.arange(lq)[None],
                              key_windows=torch.arange(lk)[None], prefix=lq, key_prefix=expected)
        layouts.append(_at(lay, stage, block))
        block += 1
    return tuple(layouts), class_token


def _at(lay: LayerLayout, stage: int, block: int) -> LayerLayout:
    return dataclasses.replace(lay, stage=stage, block=block)


# ---- the adapter ---------------------------------------------------------------------------------------


class Reader:
    """The capture's sink: call i is layer i; its q, k and bias go into the recorder as the model made them."""

    def __init__(self, recorder: Recorder, layouts: tuple[LayerLayout, ...]) -> None:
        self.recorder, self.layouts, self.layer = recorder, layouts, 0

    def __call__(self, call: Call) -> None:
        layer = self.layer
        if layer >= len(self.layouts):
            raise RuntimeError(f"the forward pass made more attention calls than the {len(self.layouts)} it made "
                               "when the model was wrapped")
        lay = self.layouts[layer]
        q = call.query.transpose(0, 1)  # (H, W, Tq, d_k)
        k = call.key.transpose(0, 1)
        if tuple(q.shape) != tuple(self.recorder.query[layer].shape) or call.scale != lay.scale \
                or tuple(k.shape) != tuple(self.recorder.key[layer].shape):
            raise RuntimeError(f"attention call {layer + 1} has other shapes than when the model was wrapped")
        self.recorder.put_query(layer, q)
        self.recorder.put_key(layer, k)
        if call.bias is not None:
            self.recorder.put_bias(layer, call.bias.clone())  # (W | 1, H | 1, Tq, Tk)
        self.recorder.skip_tokens(layer)
        self.layer += 1


def run(network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, 3, S, S) → (B, C): the network's output (a Hugging Face model's logits, embeddings or pooled output)."""
    if type(network).__module__.startswith("transformers."):
        from .hf import hf_forward

        return hf_forward(network, x)
    out = network(x)
    return out[0] if isinstance(out, (tuple, list)) else out


class GenericAdapter(Adapter):
    """Layers are the network's attention calls, in the order it makes them; no hooks on its modules."""

    @property
    def depth(self) -> int:
        return len(self.layouts)

    def attach(self, layer: int, tap) -> None:
        """Nothing to install: the capture's forward pass runs inside :class:`Intercept` (:meth:`forward_batch`)."""

    def forward_batch(self, network: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        tap = getattr(network, "_attnviz_tap", None)
        recorder = tap.current if tap is not None else None
        if recorder is None:
            return run(network, x)
        with Intercept(Reader(recorder, self.layouts)):
            return run(network, x)


def probe(network: torch.nn.Module, size: int) -> tuple[list[Call], list[tuple], list[Placement | None]]:
    """Every attention call ``network`` makes on one S × S input of zeros, in order, the shapes of the
    softmaxes over three or more axes it takes by hand (attention weights that no call makes), and per call the
    windowed module it was made in (None outside one)."""
    calls: list[Call] = []
    by_hand: list[tuple] = []
    where: list[Placement | None] = []
    weights = next(network.parameters(), None)
    x = torch.zeros(1, 3, size, size, dtype=weights.dtype if weights is not None and weights.is_floating_point()
                    else torch.float32, device=weights.device if weights is not None else "cpu")
    try:
        with torch.inference_mode(), placements(network) as now:
            def sink(call: Call) -> None:
                calls.append(call)
                where.append(now())

            with Intercept(sink, by_hand=by_hand):
                run(network, x)
    except Exception as e:  # the network's own error on this input: one sentence
        first = (str(e).strip().splitlines() or [""])[0][:160]
        raise ModelError(f"{_name(network)} did not run on a 1 × 3 × {size} × {size} input ({type(e).__name__}: "
                         f"{first}), so attnviz cannot read its attention.") from e
    return calls, by_hand, where


def adapter(network: torch.nn.Module, size: int, grid: tuple[int, int] | None = None,
            prefix: int | None = None) -> Adapter:
    """The generic adapter of ``network`` at S × S inputs, or a ModelError saying why it is not read."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ModelError(f"The input size must be a positive whole number of pixels, not {size!r}.")
    calls, by_hand, placed = probe(network, size)
    modules = attention_modules(network)
    net = _name(network)
    hint = ""
    if getattr(getattr(network, "config", None), "_attn_implementation", None) == "eager" \
            and getattr(network, "_supports_sdpa", False):  # Hugging Face's Swin V2 has no SDPA path to load
        hint = " (load it with attn_implementation=\"sdpa\")"
    if not calls and (modules or by_hand):
        where = f" in {type(modules[0]).__name__}" if modules else ""
        raise ModelError(f"{net} computes its attention softmax by hand{where}, not through "
                         f"scaled_dot_product_attention or nn.MultiheadAttention{hint}, so attnviz cannot read it "
                         "exactly and refuses it rather than show attention weights that may be wrong.")
    if not calls:
        from . import refusal

        raise ModelError(refusal(network))
    if by_hand:
        raise ModelError(f"{net} makes {len(calls)} attention calls through PyTorch but also takes {len(by_hand)} "
                         "softmax over tokens by hand, so part of its attention is not in those calls; attnviz refuses "
                         "it rather than show part of its attention.")
    if modules and len(calls) != len(modules):
        fewer = len(calls) < len(modules)
        raise ModelError(
            f"{net} has {len(modules)} attention modules ({type(modules[0]).__name__}) but makes {len(calls)} "
            f"attention calls through PyTorch, so {'some compute their softmax by hand' if fewer else 'a module makes several calls whose weights it combines'}; "
            "attnviz refuses it rather than show part of its attention.")
    layouts, class_token = layouts_of(network, size, calls, grid, prefix, placed)
    first = layouts[0]
    return GenericAdapter(
        family="generic (PyTorch attention calls)", attentions=(), blocks=(),
        num_heads=max(lay.num_heads for lay in layouts), head_dim=first.head_dim, scale=first.scale,
        patch=first.patch, embed_dim=first.num_heads * first.head_dim, num_prefix_tokens=first.prefix,
        has_class_token=class_token, layouts=layouts,
    )


def claims(network: torch.nn.Module) -> bool:
    """Every network, once no other family has claimed it, except timm's: timm's families and refusals know their
    own models (a timm attention with ``fused_attn`` off computes its softmax by hand)."""
    return not type(network).__module__.startswith("timm.")


FAMILY = register(Family("generic", adapter, recognises=claims, fallback=True))
