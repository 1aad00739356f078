"""The zoo walk (issue #22): the smallest two members of each timm vision-transformer family, random
weights, read as a new user would (``attnviz.wrap`` + ``capture_tensor``) and checked against the
family's own eager softmax.

The reference is independent of attnviz: a private copy of the network with every ``fused_attn``
turned off runs while ``softmax`` (``torch.softmax``, ``Tensor.softmax``, ``F.softmax``) is recorded,
and any ``F.scaled_dot_product_attention`` a family calls unconditionally is replaced by its eager
formula, softmax(q · kᵀ · scale + mask), recorded too. Each recorded softmax over tokens is one
layer's weights as timm computed them; attnviz's capture ran on the unchanged network's fused path.

``python -m tests.zoo`` prints the walk's table as Markdown (docs/models.md is made from it).
"""
from __future__ import annotations

import copy
import math
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import timm
import torch
import torch.nn.functional as F
from timm.models.efficientvit_msra import CascadedGroupAttention
from timm.models.tiny_vit import Attention as TinyVitAttention

import attnviz
from attnviz import ModelError
from attnviz.capture import capture_tensor

# timm module → (family, whether it has softmax attention between tokens)
FAMILIES: dict[str, tuple[str, bool]] = {
    "deit": ("DeiT", True),
    "vision_transformer_hybrid": ("hybrid ViT (CNN stem)", True),
    "vitamin": ("ViTamin", True),
    "beit": ("BEiT / BEiT v2", True),
    "swin_transformer": ("Swin", True),
    "swin_transformer_v2": ("Swin V2", True),
    "swin_transformer_v2_cr": ("Swin V2 (cr)", True),
    "cait": ("CaiT", True),
    "pit": ("PiT", True),
    "mvitv2": ("MViTv2", True),
    "levit": ("LeViT", True),
    "tiny_vit": ("TinyViT", True),
    "twins": ("Twins", True),
    "efficientformer": ("EfficientFormer", True),
    "efficientformer_v2": ("EfficientFormer V2", True),
    "xcit": ("XCiT", True),
    "convit": ("ConViT", True),
    "hiera": ("Hiera", True),
    "hieradet_sam2": ("SAM2 Hiera", True),
    "vision_transformer_sam": ("SAM ViT", True),
    "tnt": ("TNT", True),
    "volo": ("VOLO", True),
    "davit": ("DaViT", True),
    "coat": ("CoaT", False),  # factorized attention: no token-to-token weights (refusals.py)
    "gcvit": ("GC ViT", True),
    "maxxvit": ("MaxViT / CoAtNet", True),
    "fastvit": ("FastViT", True),
    "nextvit": ("Next-ViT", True),
    "crossvit": ("CrossViT", True),
    "nest": ("NesT", True),
    "pvt_v2": ("PVT v2", True),
    "efficientvit_msra": ("EfficientViT (MSRA)", True),
    "visformer": ("Visformer", True),
    "shvit": ("SHViT", True),
    "efficientvit_mit": ("EfficientViT (MIT)", False),
    "swiftformer": ("SwiftFormer", False),
    "convnext": ("ConvNeXt", False),
    "focalnet": ("FocalNet", False),
    "mambaout": ("MambaOut", False),
    "metaformer": ("MetaFormer (PoolFormer, ConvFormer, CAFormer)", False),
}
PEAK = 6.0  # q and k projection weights × this, so random attention is peaked as a trained model's
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Result:
    module: str
    name: str
    status: str  # "exact" or "refused"
    detail: str  # the refusal sentence, or the adapter's family
    worst: float = math.nan  # max |Δ| over every layer, head and weight
    peak: float = math.nan  # the largest reference weight
    layers: int = 0
    seconds: float = 0.0
    worst64: float = math.nan  # when float32 eager is off by more than TOLERANCE: capture vs eager, both float64
    truth: float = math.nan  # and then the float32 capture vs float64 eager: float32's own rounding
    summaries: float = math.nan  # walks on a device: max |Δ| of every layer's summary map against a CPU capture

    @property
    def exact(self) -> bool:
        """≤ 1e-5 against eager in float32; or, where float32 is not enough (the fused and eager paths of a
        base-size model with peaked logits drift apart by more than that, layer after layer), capture and
        eager agree to 1e-9 on the same weights in float64."""
        if self.status != "exact":
            return False
        return self.worst <= TOLERANCE or self.worst64 <= 1e-9


def members(module: str, count: int = 2) -> list[str]:
    """The ``count`` smallest models (by parameters, counted on the meta device) timm registers in ``module``."""
    sizes = []
    for name in timm.list_models(module=module):
        if name.startswith("test_"):  # timm's own CI stand-ins, not models people use
            continue
        with torch.device("meta"):
            network = timm.create_model(name, pretrained=False)
        sizes.append((sum(p.numel() for p in network.parameters()), name))
    return [name for _, name in sorted(sizes)[:count]]


# "qk": TNT's (and ConViT's) one Linear whose rows are [q; k] (its v is a separate Linear ``v``): all its
# rows are q or k. "wq", "wk": CrossViT's cross-attention projections.
QK_NAMES = {"q", "k", "to_q", "to_k", "query", "key", "q_proj", "k_proj", "qk", "wq", "wk"}


@torch.no_grad()
def peak(network: torch.nn.Module, factor: float = PEAK) -> None:
    """Scale every query and key projection (``qkv``'s q and k rows, ``q``/``k``, ``kv``'s k rows) by ``factor``
    (and give CaiT's talking-heads mix ``proj_l`` its identity)."""
    handled = per_head_peak(network, factor)
    for name, module in network.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if module in handled:
            continue
        weight = getattr(module, "weight", None)
        if leaf in {"qkv", "kv", *QK_NAMES} and weight is None:
            inner = [m for m in module.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
            weight = inner[0].weight if inner else None
        if weight is None or not isinstance(weight, torch.nn.Parameter):
            continue
        if leaf == "qkv":
            weight[: 2 * weight.shape[0] // 3] *= factor
        elif leaf == "kv":
            weight[: weight.shape[0] // 2] *= factor
        elif leaf in QK_NAMES:
            weight *= factor
        elif leaf == "proj_l" and isinstance(module, torch.nn.Linear) and module.in_features == module.out_features:
            # CaiT's talking heads mix the heads' logits with proj_l (H × H) before the softmax; at timm's init
            # (std .02) it scales every logit to ~0 and no head is peaked. Plus the identity: each head keeps
            # its own logits, mixed with the others'.
            weight += torch.eye(weight.shape[0], dtype=weight.dtype, device=weight.device)
        elif leaf in {"norm_q", "norm_k"}:  # MViTv2 normalises its pooled q and k: a scaled projection would
            weight *= factor                # be undone by the LayerNorm, so its affine output is scaled instead
            if getattr(module, "bias", None) is not None:
                module.bias *= factor
    for module in network.modules():  # LayerScale at ~1e-5 would leave later layers' inputs near the first's
        gamma = getattr(module, "gamma", None)
        if isinstance(gamma, torch.nn.Parameter) and gamma.ndim == 1:
            gamma.fill_(1.0)


def per_head_peak(network: torch.nn.Module, factor: float) -> set[torch.nn.Module]:
    """Families whose q/k/v rows are grouped per head, [q (key_dim), k (key_dim), v] for each head (where
    "the first two thirds" would scale some heads' v and miss others' k): TinyViT's and EfficientFormer's
    ``qkv`` (reshaped to (B, N, H, −1) and split per head), MaxViT's ``qkv`` when ``head_first`` and
    EfficientViT (MSRA)'s ``qkvs`` (one 1 × 1 convolution per head). Their learned attention bias (zero when built) is made random, so the walk
    checks it too. Returns the projections handled here."""
    from timm.models.efficientformer import Attention as EfficientFormerAttention
    from timm.models.maxxvit import Attention2d as MaxxVitAttention2d
    from timm.models.maxxvit import AttentionCl as MaxxVitAttentionCl

    handled = set()
    for module in network.modules():
        if isinstance(module, (TinyVitAttention, EfficientFormerAttention)):
            module.qkv.weight.view(module.num_heads, -1, module.qkv.in_features)[:, : 2 * module.key_dim] *= factor
            handled.add(module.qkv)
        elif isinstance(module, CascadedGroupAttention):
            for qkv in module.qkvs:
                qkv.conv.weight[: 2 * module.key_dim] *= factor
        elif isinstance(module, (MaxxVitAttentionCl, MaxxVitAttention2d)):
            rows = module.qkv.weight.shape[0]
            if module.head_first:  # per head [q (d), k (d), v (d)]
                module.qkv.weight.view(module.num_heads, 3, -1)[:, :2] *= factor
            else:  # [q | k | v], each of every head
                module.qkv.weight[: 2 * rows // 3] *= factor
            handled.add(module.qkv)
            continue  # its position bias is not a learned table of zeros
        else:
            continue
        module.attention_biases.copy_(2 * torch.randn_like(module.attention_biases))
        module.attention_bias_cache = {}
    return handled


# Per-family rules for an init under which a random model's attention is not a test of anything.
# LeViT: every projection is a Linear or Conv with a BatchNorm after it, and each residual branch's last
# BatchNorm starts at weight 0. With timm's running statistics (mean 0, variance 1) its random stem's
# output is ~1e-2 and every weight within 1e-4 of uniform, however the projections are scaled (and
# peak()'s rows are not LeViT's q and k: its qkv is per head [q, k, v]). A trained BatchNorm normalises
# its input, so after peak() the statistics are set to those of a batch of random images (the weights of
# 0 to 1), which undoes peak() (a BatchNorm does not see the scale of the Linear before it); the q and
# k channels of each projection's BatchNorm weight are scaled by BATCHNORM_PEAK first: logits of std ~4, as
# peaked as a ViT's under peak().
# EfficientFormer V2 (q and k 1 × 1 convolutions with a BatchNorm, NCHW): the same, with its q and k
# BatchNorms (Attention2dDownsample's q: LocalGlobalQuery's proj) scaled.
# Next-ViT's random init (truncated normal, std 0.02, for every convolution) shrinks the activations about
# tenfold per convolution, and its eval-mode BatchNorms (running variance 1) do not undo it: by the first
# attention q and k are ~1e-5 and every weight uniform. Its trained BatchNorms normalise; calibrated ones too.
CALIBRATE_BATCHNORM = {"levit", "efficientformer_v2", "nextvit"}
BATCHNORM_PEAK = 2.0
# Learned attention biases initialised to 0 (``attention_biases``, indexed by the query's and key's
# cells): drawn N(0, 1) so the walk checks that the bias is laid on the right query and key cells.
RANDOM_ATTENTION_BIASES = {"levit", "efficientformer_v2"}


@torch.no_grad()
def untrained_init(module: str, network: torch.nn.Module, size: int) -> None:
    """The per-family rules above, after :func:`peak`."""
    if module in RANDOM_ATTENTION_BIASES:
        generator = torch.Generator().manual_seed(3)
        for name, p in network.named_parameters():
            if name.endswith("attention_biases"):
                p.copy_(torch.randn(p.shape, generator=generator))
    norms = [m for m in network.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if module in CALIBRATE_BATCHNORM:
        for m in norms:
            if m.weight is not None and not m.weight.any():
                m.weight.fill_(1.0)
    if module == "efficientformer_v2":
        for m in network.modules():
            if hasattr(m, "attention_biases"):
                q = m.q.proj if hasattr(m.q, "proj") else m.q
                for bn in (q.bn, m.k.bn):
                    bn.weight *= BATCHNORM_PEAK
                    bn.bias *= BATCHNORM_PEAK
    if module == "levit":
        for m in network.modules():
            heads, kd = getattr(m, "num_heads", None), getattr(m, "key_dim", None)
            if heads is None or kd is None:
                continue
            if hasattr(m, "qkv"):  # per head [q (kd), k (kd), v]
                scaled = [(m.qkv.bn, 2 * kd)]
            else:  # AttentionDownsample: q (per head kd) and kv (per head [k (kd), v])
                scaled = [(m.q.ln.bn, kd), (m.kv.bn, kd)]
            for bn, rows in scaled:
                for p in (bn.weight, bn.bias):
                    p.view(heads, -1)[:, :rows] *= BATCHNORM_PEAK
    if module == "convit":
        # (GPSA's q and k come from one Linear ``qk``, rows [q, k], which peak() scales as QK_NAMES says.)
        # Its gate σ(gating_param) starts at σ(1) in every head: drawn N(0, 1) so each head's blend of content
        # and positional weights differs and the walk checks that the gate is laid on the right head.
        generator = torch.Generator().manual_seed(4)
        for m in network.modules():
            if hasattr(m, "gating_param") and hasattr(m, "qk"):
                m.gating_param.copy_(torch.randn(m.gating_param.shape, generator=generator))
    if module in CALIBRATE_BATCHNORM:  # in train mode each BatchNorm normalises with the batch's statistics
        for m in norms:  # and keeps them: later ones see the peaked attention's outputs
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: the statistics of this one batch
        network.train()
        network(torch.randn(8, 3, size, size, generator=torch.Generator().manual_seed(2)))
        network.eval()
        for m in norms:
            m.momentum = 0.1


@contextmanager
def recorded_softmax(seen: list[torch.Tensor]):
    """Inside the block every softmax over the last axis (and every SDPA, done eagerly) is appended to ``seen``."""
    originals = torch.softmax, torch.Tensor.softmax, F.softmax, F.scaled_dot_product_attention
    depth = [0]  # F.softmax calls Tensor.softmax: record the outermost call only

    def keep(original, x, dim, args, kwargs) -> torch.Tensor:
        depth[0] += 1
        try:
            out = original(x, dim, *args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0] == 0 and dim in (-1, out.ndim - 1):
            seen.append(out.detach())
        return out

    def softmax(x, dim=None, *args, **kwargs):
        return keep(originals[0], x, dim, args, kwargs)

    def tensor_softmax(x, dim=None, *args, **kwargs):
        return keep(originals[1], x, dim, args, kwargs)

    def functional_softmax(x, dim=None, *args, **kwargs):
        return keep(originals[2], x, dim, args, kwargs)

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
        logits = (q * (q.shape[-1] ** -0.5 if scale is None else scale)) @ k.transpose(-2, -1)
        if attn_mask is not None:
            logits = logits.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else logits + attn_mask
        return tensor_softmax(logits, -1) @ v

    torch.softmax, torch.Tensor.softmax, F.softmax, F.scaled_dot_product_attention = (
        softmax, tensor_softmax, functional_softmax, sdpa)
    try:
        yield
    finally:
        torch.softmax, torch.Tensor.softmax, F.softmax, F.scaled_dot_product_attention = originals


def convit_gpsa(network: torch.nn.Module) -> list[torch.nn.Module]:
    from timm.models.convit import GPSA

    return [m for m in network.modules() if isinstance(m, GPSA)]


# Per family (timm module), the attention modules whose final weights are not one softmax: the function
# lists them in the twin. ConViT's gated positional self-attention (GPSA) takes two softmaxes, of the
# content logits q · kᵀ · scale and of the positional scores pos_proj(rel_indices), and its weights are
# their gated blend, renormalised: neither softmax is the layer's weights. For each such module the
# softmaxes taken inside it are dropped and, in their place, timm's own ``get_attention`` is called on the
# input the module received (a hook on the twin): what the module multiplies v by, by timm's formula,
# not re-implemented here.
FINAL_WEIGHTS = {
    "convit": convit_gpsa,
}


# Softmaxes that are not token-to-token attention, named by the timm class of the module that computes them
# (read from each family's timm source): XCiT's ``XCA`` (cross-covariance attention, a channels × channels
# softmax per head), VOLO's ``OutlookAttention`` (each location's k² × k² weights come from a Linear of that
# token alone, no query-key product) and DaViT's ``ChannelAttention`` / ``ChannelAttentionV2`` (channels ×
# channels). The eager twin's modules of these classes are hooked, and every softmax recorded between one's
# call and its return is dropped from the reference (the family's adapter does not read those layers).
NOT_TOKEN_ATTENTION = {
    "xcit": ("timm.models.xcit.XCA",),
    "volo": ("timm.models.volo.OutlookAttention",),
    "davit": ("timm.models.davit.ChannelAttention", "timm.models.davit.ChannelAttentionV2"),
}


def not_token_attention(module: str | None, network: torch.nn.Module, seen: list) -> tuple[list, list]:
    """Hooks on ``network``'s modules of the classes :data:`NOT_TOKEN_ATTENTION` names for ``module``: each
    call appends (first, end) indices of ``seen`` recorded inside it. Returns (ranges, hook handles)."""
    names = set(NOT_TOKEN_ATTENTION.get(module, ()))
    ranges, handles, start = [], [], {}
    for m in network.modules():
        if f"{type(m).__module__}.{type(m).__qualname__}" not in names:
            continue
        handles.append(m.register_forward_pre_hook(lambda m, _args: start.__setitem__(m, len(seen))))
        handles.append(m.register_forward_hook(lambda m, _args, _out: ranges.append((start.pop(m), len(seen)))))
    return ranges, handles


def eager_softmaxes(network: torch.nn.Module, x: torch.Tensor, module: str | None = None,
                    dropped: list | None = None) -> list[torch.Tensor]:
    """Every softmax a private eager copy of ``network`` computes on ``x``, in order, less those that are not
    token attention in the timm family ``module`` (:data:`NOT_TOKEN_ATTENTION`; appended to ``dropped``),
    and for a family in :data:`FINAL_WEIGHTS` each listed module's ``get_attention`` instead of the
    softmaxes inside it."""
    twin = copy.deepcopy(network)
    for m in twin.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    seen: list[torch.Tensor] = []
    ranges, handles = not_token_attention(module, twin, seen)
    for m in FINAL_WEIGHTS[module](twin) if module in FINAL_WEIGHTS else ():
        mark: list[int] = []

        def before(_m, _args, mark=mark) -> None:
            mark.append(len(seen))

        def after(m, args, _out, mark=mark) -> None:
            start = mark.pop()
            weights = m.get_attention(args[0]).detach()  # timm's final weights on this module's input
            del seen[start:]  # the softmaxes taken inside the module (its forward's and this call's)
            seen.append(weights)

        handles += [m.register_forward_pre_hook(before), m.register_forward_hook(after)]
    try:
        with torch.no_grad(), recorded_softmax(seen):
            twin(x)
    finally:
        for handle in handles:
            handle.remove()
    drop = {i for first, end in ranges for i in range(first, end)}
    if dropped is not None:
        dropped.extend(seen[i] for i in sorted(drop))
    return stacked_heads(twin, [s for i, s in enumerate(seen) if i not in drop])


def stacked_heads(network: torch.nn.Module, seen: list[torch.Tensor]) -> list[torch.Tensor]:
    """One softmax per layer. EfficientViT (MSRA)'s cascaded group attention takes one softmax per head,
    (W, T, T) each, head after head (each head's input is the previous head's output): a layer's weights
    are its heads' softmaxes stacked, (W, H, T, T). Every other family already takes one per layer."""
    cascaded = [m for m in network.modules() if isinstance(m, CascadedGroupAttention)]  # in forward order
    if not cascaded:
        return seen
    heads = [len(m.qkvs) for m in cascaded]
    assert sum(heads) == len(seen), f"{len(seen)} softmaxes for {sum(heads)} heads"
    starts = [sum(heads[:i]) for i in range(len(heads))]
    return [torch.stack(seen[a:a + h], 1) for a, h in zip(starts, heads)]


def as_layers(reference: list[torch.Tensor], cap) -> list[torch.Tensor]:
    """The reference softmaxes in the capture's layout: per layer (H, Nq, Nk) over the whole image.

    A windowed layer's reference is (windows, H, Tq, Tk) (global attention: one window); the capture
    says which query token each window row is and which key token each column is
    (``cap.layout(layer).windows``, ``.keys``), so the block-diagonal whole-image matrix is put together
    here from that partition, independently of how the capture computes its rows."""
    out = []
    for layer, ref in enumerate(reference):
        layout = cap.layout(layer) if hasattr(cap, "layout") else None
        if layout is None:
            out.append(ref[0] if ref.shape[0] == 1 else ref)
            continue
        rows, cols = layout.windows, layout.keys  # (W, Tq), (W, Tk) token indices
        ref = ref.reshape(rows.shape[0], -1, rows.shape[1], cols.shape[1])  # (W, H, Tq, Tk)
        full = torch.zeros(ref.shape[1], layout.num_tokens, layout.num_keys, dtype=ref.dtype)
        for i in range(rows.shape[0]):
            full[:, rows[i][:, None], cols[i][None, :]] = ref[i]
        out.append(full)
    return out


def nest_blocks_first(softmax: torch.Tensor) -> torch.Tensor:
    """NesT's ``Attention`` attends inside image blocks with an extra axis: its softmax is
    (B, H, blocks, N, N), heads before blocks; as_layers reads (windows, H, Tq, Tk), blocks first."""
    return softmax.transpose(1, 2).flatten(0, 1) if softmax.ndim == 5 else softmax


def hiera_windows_first(softmax: torch.Tensor) -> torch.Tensor:
    """Hiera's ``MaskUnitAttention`` attends inside mask units with an extra axis: its mask-unit softmax is
    (B, H, windows, Tq, Tk) (``qkv.reshape(B, -1, num_windows, 3, heads, d).permute(3, 0, 4, 2, 1, 5)``),
    heads before windows; its global softmax is (B, H, N, N), one window."""
    return softmax.transpose(1, 2).flatten(0, 1) if softmax.ndim == 5 else softmax


# Per family (timm module), how its recorded softmaxes are put into (windows, H, Tq, Tk) order, where
# its own axis order is another. Each rule reads the family's timm source, not attnviz's code.
REFERENCE_ORDER = {
    "nest": nest_blocks_first,
    "hiera": hiera_windows_first,
}


def reference_of(module: str, network: torch.nn.Module, x: torch.Tensor, cap) -> list[torch.Tensor]:
    order = REFERENCE_ORDER.get(module)
    softmaxes = eager_softmaxes(network, x, module)
    return as_layers([order(s) for s in softmaxes] if order else softmaxes, cap)


# Families walked at another size than their default, and why. SAM 2's Hiera (hieradet_sam2) defaults to
# 896 px, which divides into its windows at every stage, but its first stage then has 224 × 224 = 50176
# tokens, and the walk compares whole-image N × N matrices (10 GB a head in float32, twice that in float64):
# it is walked at 224 px, its min_input_size and the smallest size that divides at every stage
# (windows of 8, 4, 14 and 7 on grids of 56, 28, 14 and 7 tokens). At 896 px sam2_hiera_tiny was compared
# window by window (the same max |Δ|: the whole-image matrices are zero off-window) once, by hand: 2.1e-5
# in float32, 6e-14 in float64.
WALK_SIZE = {"hieradet_sam2": 224}


def input_size(network: torch.nn.Module) -> int:
    return int(network.pretrained_cfg.get("input_size", (3, 224, 224))[-1])


def walk_one(module: str, name: str, build_kwargs: dict | None = None, size: int | None = None,
             device: str | None = None, float64: bool = False) -> Result:
    """Build ``name`` small and random, peak its attention, and read it: exact (with max |Δ|) or refused.

    ``device``: where attnviz's capture runs, on a copy of the network; the eager reference runs on the CPU, and
    every layer's summary map is compared with a CPU capture's (``Result.summaries``). ``float64``: measure the
    capture against the float64 eager softmax (``Result.truth``) even where it is within TOLERANCE of float32's."""
    start = time.perf_counter()
    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, **(build_kwargs or {})).eval()
    size = size or WALK_SIZE.get(module) or input_size(network)
    peak(network)
    untrained_init(module, network, size)
    try:
        model = attnviz.wrap(network if device is None else copy.deepcopy(network), name, "random init", size,
                             device=device or "cpu")
    except ModelError as error:
        return Result(module, name, "refused", str(error), seconds=time.perf_counter() - start)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    cap = capture_tensor(model, x.to(model.device))
    # the windows and keys each row stands for, read off a CPU capture, so the reference never reads the device's
    on_cpu = cap if device is None else capture_tensor(attnviz.wrap(network, name, "random init", size), x)
    reference = reference_of(module, network, x, on_cpu)
    assert len(reference) == cap.num_layers, f"{name}: {len(reference)} eager softmaxes, {cap.num_layers} layers"
    worst = max_difference(cap, reference)
    worst64 = truth = math.nan
    if worst > TOLERANCE or float64:
        # Large peaked logits: the float32 fused path (the capture's) and eager path drift apart layer by
        # layer. The same weights in float64 say whether the capture's arithmetic is the model's.
        network64, x64 = network.double(), x.double()
        cap64 = capture_tensor(attnviz.wrap(network64, name, "random init", size), x64)
        reference64 = reference_of(module, network64, x64, cap64)
        worst64, truth = max_difference(cap64, reference64), max_difference(cap, reference64)
    summaries = math.nan if device is None else max(  # what the page draws: the class token's row, or mean received
        float(abs(cap.summary_map(i, "mean") - on_cpu.summary_map(i, "mean")).max()) for i in range(cap.num_layers))
    return Result(module, name, "exact", model.adapter.family, worst, max(float(r.max()) for r in reference),
                  cap.num_layers, time.perf_counter() - start, worst64, truth, summaries)


def max_difference(cap, reference: list[torch.Tensor]) -> float:
    return max(float((cap.layer_weights(i).double().cpu() - ref.double()).abs().max()) for i, ref in enumerate(reference))


def one_sentence(text: str) -> bool:
    return "\n" not in text and "Traceback" not in text and text.endswith(".") and not re.search(r"\. [A-Z]", text)


def markdown(results: list[Result]) -> str:
    rows = ["| family | model | status | layers | max \\|Δ\\| | largest weight | what attnviz says |",
            "|---|---|---|---|---|---|---|"]
    for r in results:
        family = FAMILIES[r.module][0]
        if r.status == "exact":
            delta = f"{r.worst:.1e}" if math.isnan(r.worst64) else (
                f"{r.worst:.1e} (fp64: {r.worst64:.0e}; fp32 capture vs fp64: {r.truth:.1e})")
            rows.append(f"| {family} | `{r.name}` | exact | {r.layers} | {delta} | {r.peak:.2f} | {r.detail} adapter |")
        else:
            rows.append(f"| {family} | `{r.name}` | refused | | | | {r.detail} |")
    return "\n".join(rows)


if __name__ == "__main__":
    modules = sys.argv[1:] or list(FAMILIES)
    results = [walk_one(m, n) for m in modules for n in members(m)]
    print(markdown(results))
    token = [r for r in results if FAMILIES[r.module][1]]
    exact = [r for r in token if r.exact]
    print(f"\n{len(exact)} of {len(token)} models with token attention exact "
          f"({100 * len(exact) / max(len(token), 1):.0f} %); {len(results) - len(exact)} refused of {len(results)} walked.")
