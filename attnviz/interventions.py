"""A timm ViT run in pieces, so that an experiment can change what flows through it.

Two interventions, both in the network's own modules and arithmetic, leaving the shared network
object untouched (other sessions may be running it):

- **token removal**: drop patch tokens from the sequence after the position embeddings were added,
  so the kept patches keep their own positions and the prefix tokens stay; nothing
  out-of-distribution (a grey square, a blur) is put in front of the model;
- **head ablation**: zero head h's slice of the attention output, before the output projection
  (the "zero ablation" of Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?").

Only timm's standard ``Block`` / ``Attention`` is written out here (:func:`block_forward`). RoPE and
relative-position attention tie each logit to a token's place in the full grid, and Hugging Face
models run their own modules: :func:`refusal` says so in one sentence instead of approximating.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models.vision_transformer import Block, VisionTransformer

from .jobs import core_count
from .models import Model


def refusal(model: Model) -> str | None:
    """Why this model cannot be run in pieces (one sentence), or None when it can: what token removal needs. (Head
    ablation does not: any model whose heads meet in one output projection switches them off there,
    :func:`attnviz.ablation.switch_refusal`.)"""
    network = model.network
    if not isinstance(network, VisionTransformer):
        return (f"{model.public_name} is a {model.adapter.family} model, whose blocks attnviz does not yet run one at "
                "a time, so token removal is not available for it (the mean-colour and blur fills are).")
    for block in network.blocks:
        if type(block).forward is not Block.forward or type(block.attn).forward is not Attention.forward:
            return (f"{model.public_name}'s {type(block.attn).__name__} ties each attention logit to a token's place "
                    "in the full grid, so token removal is not available for it (the mean-colour and blur fills are).")
    if getattr(network, "attn_pool", None) is not None:
        return (f"{model.public_name} reads its output through an attention-pooling head, so token removal is not "
                "available for it (the mean-colour and blur fills are).")
    return None


def embed(network: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    """(B, 3, S, S) → (B, N, D): the token sequence the first block receives (positions already added)."""
    t = network.patch_embed(x)
    t = network._pos_embed(t)
    t = network.patch_drop(t)
    return network.norm_pre(t)


def keep_tokens(tokens: torch.Tensor, prefix: int, kept: torch.Tensor) -> torch.Tensor:
    """(B, N, D) with, per row, the prefix tokens and the patch tokens ``kept`` ((B, k) raster indices)."""
    b, _, d = tokens.shape
    index = kept.to(tokens.device) + prefix  # (B, k) token positions
    patches = tokens.gather(1, index[..., None].expand(b, index.shape[1], d))  # (B, k, D)
    return torch.cat([tokens[:, :prefix], patches], dim=1)  # (B, prefix + k, D)


def block_forward(block: Block, x: torch.Tensor, heads_on: torch.Tensor | None = None,
                  record: list | None = None, first: int | None = None) -> torch.Tensor:
    """timm's ``Block.forward`` (eval mode), with head h's output zeroed where ``heads_on[b, h]`` is 0.

    ``heads_on``: (B, H) of 0 / 1, or None for the plain block. ``record``: a list that receives this
    block's (q, k), each (B, H, N, d_k), for a capture of the ablated model. ``first``: only the first
    ``first`` tokens' outputs, (B, first, D) — their queries still attend to every key; each token's
    output depends on its own row alone after the attention, so they are exactly the full block's.
    """
    attn = block.attn
    h = block.norm1(x)
    b, n, _ = h.shape
    gate = attn.gate(h).sigmoid() if getattr(attn, "gate", None) is not None else None
    qkv = attn.qkv(h).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each (B, H, N, d_k)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if record is not None:
        record.append((q, k))
    if first is not None:
        q, x = q[:, :, :first], x[:, :first]  # (B, H, first, d_k), (B, first, D)
        gate = gate[:, :first] if gate is not None else None
    out = F.scaled_dot_product_attention(q, k, v, scale=attn.scale)  # (B, H, Nq, d_k)
    if heads_on is not None:
        out = out * heads_on.to(out.device, out.dtype)[:, :, None, None]
    out = out.transpose(1, 2).reshape(b, q.shape[2], attn.attn_dim)  # (B, Nq, H · d_k): the heads side by side
    out = attn.norm(out)
    if gate is not None:
        out = out * gate
    x = x + block.ls1(attn.proj(out))
    return x + block.ls2(block.mlp(block.norm2(x)))


def class_rows(network: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    """(B, N, D) stream (positions added, as :func:`embed` gives it) → (B, L, H, N): the class token's attention
    row at every layer, softmax(q_cls · kᵀ · scale) for each head — what the live camera draws. The last block
    runs only as far as its keys and the class token's query need."""
    rows = []
    last = len(network.blocks) - 1
    for layer, block in enumerate(network.blocks):
        record: list = []
        x = block_forward(block, x, record=record, first=1 if layer == last else None)
        q, k = record[0]  # (B, H, N, d_k) each
        logits = (q[:, :, :1] @ k.transpose(-2, -1)) * block.attn.scale  # (B, H, 1, N)
        rows.append(logits.softmax(-1)[:, :, 0])  # (B, H, N)
    return torch.stack(rows, 1)


def reads_class_token(network: VisionTransformer) -> bool:
    """Does ``network``'s output read the class token alone (class-token pooling, no attention pooling)? Then
    the last block needs only that token's output."""
    return network.global_pool == "token" and getattr(network, "attn_pool", None) is None


def readout(network: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    """(B, N, D) after the last block → (B, C): what ``network(x)`` returns (logits, or pooled features)."""
    return network.forward_head(network.norm(x))


def run_blocks(network: VisionTransformer, x: torch.Tensor, start: int = 0,
               heads_on: Sequence[torch.Tensor | None] | None = None, for_readout: bool = False) -> torch.Tensor:
    """Blocks ``start``… on the (B, N, D) stream ``x``; ``heads_on[l]`` as in :func:`block_forward`. With
    ``for_readout``, the last block gives only the class token where that is all :func:`readout` reads."""
    last = len(network.blocks) - 1
    for layer in range(start, len(network.blocks)):
        mask = None if heads_on is None else heads_on[layer]
        first = 1 if for_readout and layer == last and reads_class_token(network) else None
        x = block_forward(network.blocks[layer], x, mask, first=first)
    return x


@contextmanager
def per_core(name: str) -> Iterator[tuple[ThreadPoolExecutor, int]]:
    """(pool, workers): one worker per core, each running PyTorch on one thread, for an experiment's batches.

    Two one-thread calls side by side beat one two-thread call on two cores (their operations release the GIL),
    and a server tuned to one PyTorch thread per forward pass would otherwise use one core. PyTorch hands a
    thread's last setting to threads made later: the caller's own is set again at the end.
    """
    threads = torch.get_num_threads()
    workers = core_count()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=lambda: torch.set_num_threads(1)) as pool:
            yield pool, workers
    finally:
        torch.set_num_threads(threads)
