"""``python -m bench.defaults``: which sample photo and layer should the page open on, and when is a map diffuse?

For every shipped sample (``attnviz.photos.SAMPLES``), every input size the page offers the offline default
(``attnviz_app.settings.DEFAULT_SIZES``) and every layer: the share of the class token's attention (mean of
heads) inside the object's box (``attnviz/assets/boxes.json``), against the box's share of the grid (what an
even map gives), and the gain (share − baseline) / (1 − baseline) — :mod:`attnviz.boxes`. Photos are read as
the page reads them (``photos.read_photo``, fit "crop"). Also how concentrated each map is
(:func:`attnviz.stats.concentration`: the share its brightest 10 % of patches hold), which the "How to read this
map" note reports, and how often a map below :data:`attnviz.stats.DIFFUSE_BELOW` lands on its object.

Prints Markdown: one table (a row per photo and layer, a column per size), the pick by
:func:`attnviz.boxes.pick_default` at each size, and the evidence for the diffuse threshold. ``--sizes`` narrows
the sizes (about 8 s of a 2-core CPU per size).
"""
from __future__ import annotations

import argparse
import io
from typing import Iterable

from PIL import Image

import attnviz
from attnviz import boxes, photos, stats

SIZES = (196, 224, 448, 518)  # attnviz_app.settings.DEFAULT_SIZES: the Size box of the offline default
LANDS = 0.1  # a map "lands on its object" when its gain is above this


def measure(model: attnviz.Model, names: Iterable[str] = photos.SAMPLES) -> list[boxes.Measured]:
    """Every layer of every sample photo in ``names`` through ``model``, as the page shows them."""
    found = boxes.sample_boxes()
    rows = []
    for name in names:
        data = photos.sample(name).read_bytes()
        checked = photos.read_photo(data, model, f"{name}.jpg")
        cap = attnviz.capture(model, checked.image, "crop")
        file_w, file_h = Image.open(io.BytesIO(data)).size  # the box is in the file's pixels: decoding may shrink it
        w, h = checked.image.size
        box = found[name].scaled(w / file_w, h / file_h)
        for share in boxes.layer_shares(cap, box, (w, h), "crop", model.data_config["crop_pct"]):
            top = stats.concentration(cap.summary_map(share.layer, "mean")).top
            rows.append(boxes.Measured(name, model.size, cap.num_layers, share, top))
    return rows


def table(rows: list[boxes.Measured], sizes: list[int]) -> str:
    cell = {(r.photo, r.size, r.share.layer): r for r in rows}
    first = sizes[0]
    lines = ["| photo (box's share of the grid) | layer | " + " | ".join(f"{s} px" for s in sizes)
             + f" | best head at {first} px | top 10 % hold at {first} px |",
             "|---|---|" + "---|" * (len(sizes) + 2)]
    for name in dict.fromkeys(r.photo for r in rows):
        layers = sorted({r.share.layer for r in rows if r.photo == name})
        for layer in layers:
            here = cell[(name, first, layer)]
            label = f"{name} ({here.share.baseline:.3f})" if layer == layers[0] else ""
            shares = " | ".join(f"{cell[(name, s, layer)].share.mean:.3f} ({cell[(name, s, layer)].share.gain:+.2f})"
                                for s in sizes)
            best = int(here.share.heads.argmax())
            lines.append(f"| {label} | {layer + 1} | {shares} | {best + 1}: {here.share.heads[best]:.3f} | "
                         f"{here.top:.3f} |")
    return "\n".join(lines)


def threshold_evidence(rows: list[boxes.Measured]) -> str:
    diffuse = [r for r in rows if r.top < stats.DIFFUSE_BELOW]
    rest = [r for r in rows if r.top >= stats.DIFFUSE_BELOW]
    missed = sum(r.share.gain <= LANDS for r in diffuse)
    landed = sum(r.share.gain > LANDS for r in rest)
    return (f"Diffuse (brightest 10 % of patches hold < {stats.DIFFUSE_BELOW:.2f}): {len(diffuse)} of {len(rows)} "
            f"maps; {missed} of them ({missed / max(1, len(diffuse)):.0%}) gain ≤ {LANDS} on their object's box. "
            f"Of the other {len(rest)}, {landed} ({landed / max(1, len(rest)):.0%}) gain more than {LANDS}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = parser.parse_args()
    rows = [row for size in args.sizes for row in measure(attnviz.load_model(size=size, device="cpu"))]
    print("Inside share of the mean-of-heads map (gain over an even map in brackets):\n")
    print(table(rows, args.sizes))
    print()
    for size in args.sizes:
        pick = boxes.pick_default(rows, size)
        print(f"- Pick at {size} px ({boxes.PICK_RULE}): {pick.photo}, layer {pick.share.layer + 1} — inside "
              f"{pick.share.mean:.3f} against {pick.share.baseline:.3f}, gain {pick.share.gain:+.3f}, lift "
              f"{pick.share.lift:.2f}×")
    print(f"\n{threshold_evidence(rows)}")


if __name__ == "__main__":
    main()
