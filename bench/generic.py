"""``python -m bench.generic``: what the generic path (attnviz.adapters.generic) costs, against the fused forward.

torchvision's ``vit_b_16`` (random weights: the cost does not depend on them) and a hand-written ViT-S/16 on
``F.scaled_dot_product_attention``, each at 224 px: the network's own forward under ``torch.inference_mode``
(the floor: torchvision's nn.MultiheadAttention takes its fused fast path there) against attnviz's capture (the
same forward inside the per-thread interception, which takes nn.MultiheadAttention's slow path, plus the copies of
q and k). Medians over interleaved runs, measured side by side in one process. Prints a Markdown table.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import attnviz
from bench.__main__ import floor_and_capture


class SdpaAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2, self.attn = nn.LayerNorm(dim), nn.LayerNorm(dim), SdpaAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SdpaViT(nn.Module):
    """A ViT-S/16 as one writes it by hand: 12 blocks, 6 heads, 384 channels, a class token."""

    def __init__(self, size: int = 224, dim: int = 384, heads: int = 6, depth: int = 12) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, 16, 16)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (size // 16) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def networks(size: int) -> dict[str, nn.Module]:
    import torchvision

    return {"torchvision vit_b_16 (nn.MultiheadAttention)": torchvision.models.vit_b_16(weights=None, image_size=size),
            "hand-written ViT-S/16 (F.scaled_dot_product_attention)": SdpaViT(size)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.generic")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}, {args.size} px, "
          f"medians of {args.repeats}")
    print("| model | N | fused forward (floor) | attnviz capture (generic path) | ratio |")
    print("|---|---|---|---|---|")
    for name, network in networks(args.size).items():
        torch.manual_seed(0)
        model = attnviz.wrap(network, name, "random init", args.size, device=args.device)
        x = torch.randn(1, 3, args.size, args.size, device=args.device)

        t = floor_and_capture(model, x, args.repeats)
        print(f"| {name} | {model.num_tokens} | {t['floor'] * 1000:.0f} ms | {t['capture'] * 1000:.0f} ms | "
              f"{t['capture'] / t['floor']:.2f}× |")


if __name__ == "__main__":
    main()
