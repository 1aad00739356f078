"""``python -m bench.families``: what capture costs for each attention family, against the floor.

Each family's ViT-S-sized model (random init: the cost does not depend on the weights) at 224 px
(BEiT: base, the smallest it has; Swin V2: 256 px, where its windows divide every stage):
timm's own fused forward (the floor) vs attnviz's capture (fused forward + q/k/norm hooks + the
RoPE rotation or the shared bias). Medians over interleaved runs. Prints a Markdown table.
"""
from __future__ import annotations

import argparse

import timm
import torch

import attnviz
from bench.__main__ import floor_and_capture

MODELS = {
    "timm ViT": "vit_small_patch16_224",
    "timm RoPE (EVA-02)": "eva02_small_patch14_224",
    "timm RoPE (DINOv3)": "vit_small_patch16_dinov3",
    "timm RoPE (vit_*_rope)": "vit_small_patch16_rope_224",
    "timm relative position": "vit_relpos_small_patch16_224",
    "timm ViT, CNN stem (hybrid)": "vit_small_r26_s32_224",
    "timm BEiT": "beit_base_patch16_224",  # BEiT has no ViT-S: base
    "timm Swin": "swin_tiny_patch4_window7_224",
    "timm Swin V2": "swinv2_tiny_window8_256",
    # the families added later in #22, each at its own input size (no img_size passed: several have none)
    "timm Swin V2 (cr)": "swinv2_cr_tiny_224",
    "timm NesT": "nest_tiny",
    "timm TinyViT": "tiny_vit_5m_224",
    "timm EfficientViT (MSRA)": "efficientvit_m0",
    "timm EfficientFormer": "efficientformer_l1",
    "timm EfficientFormer V2": "efficientformerv2_s0",
    "timm Visformer": "visformer_tiny",
    "timm SHViT": "shvit_s1",
    "timm PiT": "pit_s_224",
    "timm CaiT": "cait_xxs24_224",
    "timm LeViT": "levit_128s",
    "timm PVT v2": "pvt_v2_b0",
    "timm Twins": "twins_svt_small",
    "timm Next-ViT": "nextvit_small",
    "timm MaxViT": "maxvit_pico_rw_256",
    "timm GC ViT": "gcvit_xxtiny",
}
SIZES = {"swinv2_tiny_window8_256": 256}  # Swin V2's 8-token windows do not divide the 28 × 28 stage at 224 px
OWN_SIZE = set(list(MODELS.values())[list(MODELS).index("timm Swin V2 (cr)"):])  # built at their default size


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.families")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", nargs="*", help="only these families (e.g. 'timm Swin')")
    args = parser.parse_args()
    print("| family | model | N (first stage) | timm fused forward (floor) | attnviz capture |")
    print("|---|---|---|---|---|")
    for family, name in MODELS.items():
        if args.only and family not in args.only:
            continue
        if name in OWN_SIZE:
            network = timm.create_model(name, pretrained=False)
            size = int(network.pretrained_cfg["input_size"][-1])
        else:
            size = SIZES.get(name, args.size - args.size % (14 if "patch14" in name else 16))
            network = timm.create_model(name, pretrained=False, img_size=size)
        model = attnviz.wrap(network, name, "random init", size, device=args.device)
        x = torch.randn(1, 3, size, size, device=args.device)

        t = floor_and_capture(model, x, args.repeats)
        tokens = model.adapter.layouts[0].num_tokens if model.adapter.layouts is not None else model.num_tokens
        print(f"| {family} | {name} | {tokens} | {t['floor'] * 1000:.0f} ms | "
              f"{t['capture'] * 1000:.0f} ms ({t['capture'] / t['floor']:.2f}×) |")


if __name__ == "__main__":
    main()
