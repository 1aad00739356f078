"""Vision transformers written by hand, as a user would, for the generic path (attnviz.adapters.generic).

Each records, when asked (``network.reference = []``), the weights its attention computes by hand in float64 from
the very q, k and mask it hands to PyTorch: the reference the capture must equal. ``sdpa_vit`` and ``mha_vit`` are
also builders the CLI's ``--model generic_models:sdpa_vit`` loads.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK = 6.0  # q and k weights scaled up: softmax as peaked as in a trained model


def reference_softmax(q, k, scale, mask=None, causal=False) -> torch.Tensor:
    """softmax(q · kᵀ · scale + mask) in float64, written out: (B, H, L, d), (B, H, S, d) → (B, H, L, S)."""
    logits = torch.einsum("bhld,bhsd->bhls", q.double(), k.double()) * scale
    if causal:
        logits = logits.masked_fill(~torch.ones(logits.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        logits = logits.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else logits + mask.double()
    return logits.softmax(-1)


class SdpaAttention(nn.Module):
    """q, k, v from one linear; F.scaled_dot_product_attention with this layer's mask, causal flag, scale and
    grouped key heads (``kv_heads`` < ``heads``: enable_gqa)."""

    def __init__(self, dim: int, heads: int, kv_heads: int | None = None, mask: torch.Tensor | None = None,
                 causal: bool = False, scale: float | None = None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads or heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * self.kv_heads * self.d)
        self.proj = nn.Linear(dim, dim)
        self.mask, self.causal, self.scale = mask, causal, scale
        self.reference: list | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).reshape(b, n, self.heads, self.d).transpose(1, 2)  # (B, H, N, d)
        k, v = self.kv(x).reshape(b, n, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4)  # (B, Hkv, N, d)
        gqa = self.kv_heads != self.heads
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal, scale=self.scale,
                                             enable_gqa=gqa)
        if self.reference is not None:
            kk = k.repeat_interleave(self.heads // self.kv_heads, dim=1) if gqa else k
            scale = self.scale if self.scale is not None else self.d ** -0.5
            self.reference.append(reference_softmax(q, kk, scale, self.mask, self.causal)[0])
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))


class MhaAttention(nn.Module):
    """nn.MultiheadAttention as a block's attention; ``need_weights`` as the model asks for it."""

    def __init__(self, dim: int, heads: int, need_weights: bool = False, mask: torch.Tensor | None = None) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.need_weights, self.mask = need_weights, mask
        self.reference: list | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.attn(x, x, x, need_weights=self.need_weights, attn_mask=self.mask)
        if self.reference is not None:  # the module's own eager weights, per head
            _, w = self.attn(x, x, x, need_weights=True, average_attn_weights=False, attn_mask=self.mask)
            self.reference.append(w[0].double())
        return out


class Block(nn.Module):
    def __init__(self, dim: int, attention: nn.Module) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = attention
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class HandViT(nn.Module):
    """Patch embedding (a stride-p convolution), a class token, position embeddings, blocks, a linear head."""

    def __init__(self, attentions: list[nn.Module], dim: int = 32, patch: int = 8, size: int = 32,
                 class_token: bool = True, classes: int = 5) -> None:
        super().__init__()
        self.image_size = size  # the input side it was built for (what a builder's model says)
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim)) if class_token else None
        tokens = (size // patch) ** 2 + int(class_token)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.5)
        self.blocks = nn.ModuleList(Block(dim, a) for a in attentions)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, P, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1)
        x = x + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0] if self.cls_token is not None else x.mean(1))

    def record(self) -> None:
        for block in self.blocks:
            block.attention.reference = []

    def references(self) -> list[torch.Tensor]:
        """Per layer (H, L, S) float64: what each attention computed by hand on the last pass; recording stops."""
        found = [block.attention.reference[-1] for block in self.blocks]
        for block in self.blocks:
            block.attention.reference = None
        return found


def sharpen(network: nn.Module) -> nn.Module:
    """Scale every q and k projection ×PEAK (SDPA: ``q``, ``kv``'s key half; nn.MultiheadAttention: in_proj's q and k)."""
    with torch.no_grad():
        for m in network.modules():
            if isinstance(m, SdpaAttention):
                m.q.weight *= PEAK
                m.kv.weight.view(2, -1, m.kv.weight.shape[-1])[0] *= PEAK
            elif isinstance(m, nn.MultiheadAttention):
                m.in_proj_weight[: 2 * m.embed_dim] *= PEAK
    return network.eval()


def sdpa_vit() -> HandViT:
    """A 32 px ViT on F.scaled_dot_product_attention: 2 layers, 4 heads, a class token (the CLI test's builder)."""
    torch.manual_seed(0)
    return sharpen(HandViT([SdpaAttention(32, 4), SdpaAttention(32, 4)]))


def mha_vit(need_weights: bool = False) -> HandViT:
    """A 32 px ViT on nn.MultiheadAttention: 2 layers, 4 heads, a class token."""
    torch.manual_seed(1)
    return sharpen(HandViT([MhaAttention(32, 4, need_weights), MhaAttention(32, 4, need_weights)]))


def hf_swin(attn: str = "sdpa", size: int = 64) -> nn.Module:
    """Hugging Face's SwinModel at 64 px, random weights, q and k ×4·PEAK (Hugging Face initialises them with std
    0.02, about a sixth of nn.Linear's own at this width): patch 4, window 4, three stages of two
    blocks — a 16 × 16 grid in 16 windows, 8 × 8 in 4, and 4 × 4, where the window is the whole grid and the
    second block's shift is clamped to 0. The page test's builder."""
    import transformers

    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=size, patch_size=4, embed_dim=24, depths=[2, 2, 2],
                                     num_heads=[2, 2, 4], window_size=4)
    config._attn_implementation = attn
    network = transformers.SwinModel(config).eval()
    with torch.no_grad():
        for m in network.modules():
            if type(m).__name__ == "SwinAttention":
                m.q_proj.weight *= 4 * PEAK
                m.k_proj.weight *= 4 * PEAK
    return network
