"""Figures for papers and slides: a capture's maps as one SVG, PDF or PNG, composed by matplotlib.

A figure is a row of panels — the photo as the model saw it, then the class token's map of every
chosen layer × head (``"cls"``), the attention rollout (``"rollout"``, Abnar & Zuidema 2020) — and, with
``"heads"``, a block below: one row per chosen layer, one small map per head and the mean of heads.
Each map is the photo as a raster at the model's own resolution (S × S, never resampled; an SVG holds
it once and draws it under every map with ``<use>``) under one vector rectangle per patch (``pcolormesh``; its group in the SVG has the id ``heatmap-<n>``), with a
colour bar whose numbers are the map's smallest, middle and largest attention weight. The model's
name, input size and grid are written under the title.

matplotlib draws it all with its own backends (``matplotlib.figure.Figure``; pyplot is never used,
so many sessions can draw at once). Text stays text: PDFs embed a subset of each font (TrueType,
``pdf.fonttype 42``), and SVGs keep ``<text>`` elements and carry a subset of each font they use as
a ``data:`` URI in an ``@font-face`` rule, so 繁體中文 renders without the font installed and the file
names nothing outside itself. Traditional Chinese needs the Noto Sans CJK TC font (Debian's
``fonts-noto-cjk``); without it, asking for ``lang="zh-TW"`` is refused with one sentence.

    >>> fig = figure.compose(cap, layers=(0, 5, 11), heads=("mean", 0), views=("cls",))
    >>> figure.save(fig, "fig.pdf", dpi=300)

Layers and heads are 0-based here, as everywhere in the library (the titles count from 1).
"""
from __future__ import annotations

import base64
import io
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

import matplotlib
import numpy as np
from matplotlib import font_manager
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from PIL import Image

import attnviz.atomic as atomic
import attnviz.i18n as i18n
from .capture import Capture, Head
from .errors import AttnvizError
from .rollout import rollout_layers, rollout_map

VIEWS = ("cls", "rollout", "heads")
FORMATS = ("svg", "pdf", "png")
LATIN_FONT = "DejaVu Sans"  # matplotlib's own font: always there
CJK_FONT = "Noto Sans CJK TC"  # Debian fonts-noto-cjk; the Traditional Chinese face of the .ttc
PANEL_IN = 2.2  # side of one map, inches
TILE_IN = 1.1  # side of one map in the heads block
# matplotlib reads these at draw and save time only from its process-wide rcParams; _DRAWING keeps two
# figures of this module from changing them under each other (nothing else in attnviz reads them).
RC = {"pdf.fonttype": 42, "svg.fonttype": "none", "svg.hashsalt": "attnviz", "image.composite_image": False,
      "font.family": [LATIN_FONT, CJK_FONT]}
_DRAWING = threading.Lock()


class FigureError(AttnvizError, ValueError):
    """A figure that cannot be made as asked; the message is one sentence."""


@dataclass(frozen=True, eq=False)
class Panel:
    """One map of a figure: its values on the patch grid and its title."""

    view: str  # "cls", "rollout" or "heads"
    values: np.ndarray  # (h, w) attention weights
    title: str
    layer: int | None  # 0-based; None for rollout
    head: Head | None
    vmin: float  # the colour scale's ends (a heads row shares one scale)
    vmax: float


def _head_name(head: Head, lang: str) -> str:
    if isinstance(head, str):
        return i18n.text(lang, f"view.head_{head}")
    return i18n.text(lang, "view.head_n", n=head + 1)


def _check(cap: Capture, layers: Sequence[int], heads: Sequence[Head], views: Sequence[str], lang: str) -> None:
    if lang not in i18n.LANGUAGES:
        raise FigureError(f"the language must be one of {', '.join(i18n.LANGUAGES)}, not {lang!r}.")
    unknown = [v for v in views if v not in VIEWS]
    if unknown or not views:
        raise FigureError(f"the views must be some of {', '.join(VIEWS)}, not {', '.join(map(str, unknown)) or 'none'}.")
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < cap.num_layers:
            raise FigureError(f"layer {layer!r} is not one of this model's layers (1…{cap.num_layers} on the page, "
                              f"0…{cap.num_layers - 1} in the library).")
    fewest = min((cap.heads(layer) for layer in layers), default=cap.num_heads)  # every layer named has these
    for head in heads:
        if not (head in ("mean", "max", "min") or (isinstance(head, (int, np.integer)) and not isinstance(head, bool)
                                                   and 0 <= head < fewest)):
            raise FigureError(f"head {head!r} is not mean, max, min or one of the {fewest} heads of the layers named.")
    if ("cls" in views or "heads" in views) and not layers:
        raise FigureError("name at least one layer for the cls and heads views.")
    if "cls" in views and not heads:
        raise FigureError("name at least one head (or mean) for the cls view.")


def panels(cap: Capture, layers: Sequence[int] = (), heads: Sequence[Head] = ("mean",),
           views: Sequence[str] = ("cls",), lang: str = i18n.DEFAULT,
           rollout: tuple[int, int, Head, float] | None = None) -> tuple[tuple[Panel, ...], tuple[tuple[Panel, ...], ...]]:
    """The maps of a figure, as plain values: (the top row's panels, the heads block's rows).

    ``cls``: :meth:`Capture.summary_map` of each layer × head (the class token's row, or the mean each
    patch receives for a model without a class token); ``rollout``: :func:`attnviz.rollout.rollout_map`
    with ``rollout`` = (first layer, last layer, head fusion, discard ratio), by default every layer,
    head mean, nothing discarded; ``heads``: per layer, every head's map and their mean, on one scale.
    """
    layers = tuple(int(x) for x in layers) if all(isinstance(x, (int, np.integer)) for x in layers) else tuple(layers)
    _check(cap, layers, heads, views, lang)
    top: list[Panel] = []
    if "cls" in views:
        for layer in layers:
            for head in heads:
                values = cap.summary_map(layer, head)
                title = i18n.text(lang, "figure.cls_title", layer=layer + 1, head=_head_name(head, lang))
                top.append(Panel("cls", values, title, layer, head, float(values.min()), float(values.max())))
    if "rollout" in views:
        first, last, fusion, discard = rollout or (*rollout_layers(cap), "mean", 0.0)
        values = rollout_map(cap, first, last, fusion, discard)
        title = i18n.text(lang, "figure.rollout_title", first=first + 1, last=last + 1, head=_head_name(fusion, lang))
        if discard:
            title += i18n.text(lang, "figure.rollout_discard", percent=round(discard * 100))
        top.append(Panel("rollout", values, title, None, fusion, float(values.min()), float(values.max())))
    block: list[tuple[Panel, ...]] = []
    if "heads" in views:
        for layer in layers:
            maps = [(h, cap.summary_map(layer, h)) for h in [*range(cap.heads(layer)), "mean"]]
            lo = float(min(m.min() for _, m in maps))
            hi = float(max(m.max() for _, m in maps))
            block.append(tuple(
                Panel("heads", m, i18n.text(lang, "figure.heads_tile", layer=layer + 1,
                                            head=i18n.text(lang, "figure.mean") if h == "mean" else _head_name(h, lang)),
                      layer, h, lo, hi) for h, m in maps))
    return tuple(top), tuple(block)


def _ticks(lo: float, hi: float) -> list[float]:
    return [lo, (lo + hi) / 2, hi] if hi > lo else [lo]


def _draw_map(ax, picture: np.ndarray, panel: Panel, cmap: str, alpha: float, index: int, small: bool) -> None:
    h, w = panel.values.shape
    ax.imshow(picture, extent=(0, w, h, 0), interpolation="none")  # the photo, once, S × S pixels
    norm = Normalize(panel.vmin, panel.vmax) if panel.vmax > panel.vmin else Normalize(panel.vmin - 1, panel.vmin)
    mesh = ax.pcolormesh(np.arange(w + 1), np.arange(h + 1), panel.values, cmap=cmap, norm=norm, alpha=alpha,
                         edgecolors="none", antialiased=False)
    mesh.set_gid(f"heatmap-{index}")  # one <path> per patch, in raster order
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(panel.title, fontsize=6 if small else 9)
    return mesh


def _colourbar(fig: Figure, ax, mesh, panel: Panel, size: float, beside: bool = False) -> None:
    """The map's colour scale with its smallest, middle and largest weight: under the map, or ``beside`` it."""
    cax = ax.inset_axes([1.06, 0.0, 0.08, 1.0] if beside else [0.0, -0.13, 1.0, 0.06])
    bar = fig.colorbar(mesh, cax=cax, orientation="vertical" if beside else "horizontal")
    bar.solids.set_alpha(1.0)  # the scale shows the colours themselves, not as blended
    bar.solids.set_rasterized(False)  # vector too (matplotlib rasterises bars of 50+ colours by default)
    bar.solids.set_edgecolor("face")  # no hairline seams between its 256 rectangles in a viewer
    ticks = _ticks(panel.vmin, panel.vmax)
    bar.set_ticks(ticks, labels=[f"{v:.3g}" for v in ticks])
    bar.ax.tick_params(labelsize=size)
    labels = bar.ax.get_xticklabels()
    if len(labels) == 3 and not beside:  # the end numbers inside the bar's width, clear of the next panel's
        labels[0].set_horizontalalignment("left")
        labels[-1].set_horizontalalignment("right")


def compose(cap: Capture, layers: Sequence[int] = (), heads: Sequence[Head] = ("mean",),
            views: Sequence[str] = ("cls",), *, picture: Image.Image | None = None, cmap: str = "inferno",
            alpha: float = 0.6, lang: str = i18n.DEFAULT, model: str | None = None,
            rollout: tuple[int, int, Head, float] | None = None, columns: int = 4) -> Figure:
    """The figure as a matplotlib ``Figure`` (not yet saved: see :func:`save`).

    ``picture``: the S × S picture the model saw (default: rebuilt from ``cap.input``); ``model``: the
    name written on the figure (default: the one the capture records).
    """
    if not cjk_font() and lang == "zh-TW":
        raise FigureError("Traditional Chinese text needs the Noto Sans CJK TC font (Debian: apt-get install "
                          "fonts-noto-cjk); make the figure with --lang en, or install the font.")
    if cmap not in matplotlib.colormaps:
        raise FigureError(f"{cmap!r} is not a matplotlib colour map.")
    top, block = panels(cap, layers, heads, views, lang, rollout)
    if picture is None:
        if cap.prepared is None:
            raise FigureError("this capture does not record how its input was made; pass picture=model.view(image).")
        picture = cap.prepared.picture(cap.input)
    pixels = np.asarray(picture.convert("RGB"))
    name = model or (cap.prepared.model if cap.prepared is not None else "?")
    h, w = cap.grid
    with _DRAWING, matplotlib.rc_context(RC):
        tiles = 1 + len(top)  # the photo, then the maps
        cols = min(columns, tiles)
        rows = -(-tiles // cols)
        heads_cols = cap.num_heads + 1
        top_h = rows * (PANEL_IN + 0.6)
        block_h = len(block) * (TILE_IN + 0.4) + (0.3 if block else 0)
        width = max(cols * (PANEL_IN + 0.3), heads_cols * (TILE_IN + 0.15) + 1.2 if block else 0)
        fig = Figure(figsize=(width, top_h + block_h + 0.6))
        fig.suptitle(i18n.text(lang, "figure.suptitle", model=name, size=pixels.shape[1], h=h, w=w,
                               layers=cap.num_layers, heads=cap.num_heads), fontsize=10)
        ratios = [top_h] + ([block_h] if block else [])
        outer = fig.add_gridspec(len(ratios), 1, height_ratios=ratios, top=1 - 0.55 / fig.get_figheight(),
                                 bottom=0.04, hspace=0.15)
        grid = outer[0].subgridspec(rows, cols, hspace=0.3, wspace=0.15)
        ax = fig.add_subplot(grid[0, 0])
        ax.imshow(pixels, interpolation="none")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(i18n.text(lang, "figure.photo_title", size=pixels.shape[1]), fontsize=9)
        for i, panel in enumerate(top, start=1):
            ax = fig.add_subplot(grid[i // cols, i % cols])
            mesh = _draw_map(ax, pixels, panel, cmap, alpha, i - 1, small=False)
            _colourbar(fig, ax, mesh, panel, 7)
        index = len(top)
        if block:
            # a last, narrow column keeps room for each row's colour bar beside its mean
            sub = outer[1].subgridspec(len(block) + 1, heads_cols + 1, height_ratios=[0.12] + [1] * len(block),
                                       width_ratios=[1] * heads_cols + [0.4], hspace=0.5, wspace=0.08)
            title_ax = fig.add_subplot(sub[0, :heads_cols])
            title_ax.axis("off")
            title_ax.set_title(i18n.text(lang, "figure.heads_title"), fontsize=9)
            for r, row in enumerate(block):
                for c, panel in enumerate(row):
                    ax = fig.add_subplot(sub[r + 1, c])
                    mesh = _draw_map(ax, pixels, panel, cmap, alpha, index, small=True)
                    index += 1
                    if c == len(row) - 1:  # one scale per layer: its bar under the mean
                        _colourbar(fig, ax, mesh, panel, 6, beside=True)
    return fig


def save(fig: Figure, target: str | Path | BinaryIO, format: str | None = None, dpi: int = 300) -> None:
    """Write ``fig`` as SVG, PDF or PNG (``format``, default: the file name's suffix) at ``dpi``.

    A path is written whole or not at all (:mod:`attnviz.atomic`); a file object gets the bytes.
    """
    if format is None:
        if not isinstance(target, (str, Path)):
            raise FigureError("say the format (svg, pdf or png) when writing to a file object.")
        format = Path(target).suffix.lstrip(".").lower()
    if format not in FORMATS:
        raise FigureError(f"the format must be svg, pdf or png, not {format!r}.")
    if not (isinstance(dpi, int) and 10 <= dpi <= 1200):
        raise FigureError(f"the resolution must be a whole number of dots per inch from 10 to 1200, not {dpi!r}.")
    data = to_bytes(fig, format, dpi)
    if isinstance(target, (str, Path)):
        atomic.write_bytes(target, data)
    else:
        target.write(data)


def to_bytes(fig: Figure, format: str, dpi: int = 300) -> bytes:
    """The figure's file content: SVG (fonts embedded), PDF or PNG."""
    buffer = io.BytesIO()
    metadata = {"svg": {"Creator": "attnviz"}, "pdf": {"Creator": "attnviz"}, "png": {"Software": "attnviz"}}[format]
    with _DRAWING, matplotlib.rc_context(RC):
        fig.savefig(buffer, format=format, dpi=dpi, metadata=metadata)
    data = buffer.getvalue()
    if format != "svg":
        return data
    svg = share_images(data.decode("utf-8"))
    # the cells edge to edge without the hairline seams a viewer's anti-aliasing draws between them
    svg = re.sub(r'<g id="(heatmap-\d+)">', r'<g id="\1" style="shape-rendering: crispEdges">', svg)
    return embed_fonts(svg).encode("utf-8")


def figure_bytes(cap: Capture, format: str = "svg", dpi: int = 300, **options) -> bytes:
    """:func:`compose` then :func:`to_bytes`: one call for a page's download button."""
    if format not in FORMATS:
        raise FigureError(f"the format must be svg, pdf or png, not {format!r}.")
    return to_bytes(compose(cap, **options), format, dpi)


def chart_bytes(chart, format: str = "svg", dpi: int = 300) -> bytes:
    """An Altair chart (or a Vega-Lite spec as a dict) as SVG, PDF or PNG, axes and labels kept, via
    vl-convert (Vega's own renderer). Text is drawn in Noto Sans CJK TC when it is installed (its Latin
    letters too; DejaVu Sans for the few signs it lacks, such as ✕), so Chinese labels never show as
    boxes; an SVG carries the subset fonts as data: URIs. Nothing outside the spec is fetched
    (``allowed_base_urls=[]``).

    A chart made for the page converts as it is: its selections (clicks, hovers, a legend bound to a
    selection) stay in the spec and are drawn as before any interaction, and a width or height of
    ``"container"`` (the page's column, which a file does not have) becomes Vega-Lite's default size."""
    try:
        import vl_convert
    except ImportError:
        raise FigureError("charts as SVG or PDF need vl-convert-python: pip install 'attnviz[figures]'.") from None
    if format not in FORMATS:
        raise FigureError(f"the format must be svg, pdf or png, not {format!r}.")
    spec = _without_container(chart.to_dict() if hasattr(chart, "to_dict") else dict(chart))
    family = CJK_FONT if cjk_font() else LATIN_FONT
    font = f"{CJK_FONT}, {LATIN_FONT}" if family == CJK_FONT else LATIN_FONT
    # aria off: each mark's aria-label repeats its data (a photo's whole data: URL), doubling the file
    options = {"config": {"font": font, "aria": False}, "allowed_base_urls": []}
    if format == "svg":
        svg = vl_convert.vegalite_to_svg(spec, **options)
        fallback = LATIN_FONT if family == CJK_FONT else None
        return embed_fonts(svg, (family,), fallback=fallback).encode("utf-8")
    if format == "pdf":
        return vl_convert.vegalite_to_pdf(spec, **options)
    return vl_convert.vegalite_to_png(spec, scale=dpi / 72, **options)


def _without_container(spec):
    """``spec`` with every ``width`` / ``height`` of ``"container"`` left out, at any depth."""
    if isinstance(spec, dict):
        return {key: _without_container(value) for key, value in spec.items()
                if not (key in ("width", "height") and value == "container")}
    if isinstance(spec, list):
        return [_without_container(value) for value in spec]
    return spec


# ---- fonts ----

@lru_cache(maxsize=None)
def _font_file(family: str) -> tuple[str, int] | None:
    """(file, face number) of the installed font ``family``, or None."""
    from fontTools.ttLib import TTCollection, TTFont

    candidates = [f.fname for f in font_manager.fontManager.ttflist if f.name == family]
    if not candidates:  # matplotlib's font list can predate the font's installation
        candidates = [p for p in font_manager.findSystemFonts() if "NotoSansCJK-Regular" in p]
    for path in candidates:
        fonts = TTCollection(path).fonts if path.lower().endswith(".ttc") else [TTFont(path, lazy=True)]
        for number, font in enumerate(fonts):
            if font["name"].getDebugName(1) == family:
                return path, number
    return None


@lru_cache(maxsize=None)
def cjk_font() -> bool:
    """Whether the Traditional Chinese font is installed (and known to matplotlib from now on)."""
    found = _font_file(CJK_FONT)
    if found is None:
        return False
    if not any(f.name == CJK_FONT for f in font_manager.fontManager.ttflist):
        font_manager.fontManager.addfont(found[0])  # adds the faces of a file already on disk; once per process
    return True


def _found(family: str) -> tuple[str, int] | None:
    """(file, face number) of ``family``: matplotlib's own font, or an installed one."""
    if family == LATIN_FONT:
        return font_manager.findfont(LATIN_FONT, fallback_to_default=False), 0
    return _font_file(family)


@lru_cache(maxsize=None)
def _covered(family: str) -> frozenset[int]:
    """The code points ``family`` has a glyph for (none when it is not installed)."""
    from fontTools.ttLib import TTFont

    found = _found(family)
    return frozenset() if found is None else frozenset(TTFont(found[0], fontNumber=found[1], lazy=True).getBestCmap())


@lru_cache(maxsize=64)
def _subset(family: str, characters: str) -> bytes | None:
    """A subset of ``family`` holding just ``characters`` (plus .notdef), as an OpenType file. Kept for the next
    file with the same words (a class downloading one chart): subsetting the CJK font takes 0.3–0.7 s here."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    found = _found(family)
    if found is None:
        return None
    font = TTFont(found[0], fontNumber=found[1])
    logging.getLogger("fontTools.subset").setLevel(logging.ERROR)  # "FFTM NOT subset": a timestamp table, dropped
    options = subset.Options()
    options.name_IDs = ["*"]
    options.notdef_outline = True
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=characters)
    subsetter.subset(font)
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()


_TEXT = re.compile(r"<text\b[^>]*>([^<]*)</text>")
_IMAGE = re.compile(r"<image\b([^>]*?)/>", re.S)
_ATTRIBUTE = re.compile(r'([\w:-]+)="([^"]*)"')


def share_images(svg: str) -> str:
    """``svg`` with a picture that matplotlib wrote several times (the photo under every map) kept once, in
    ``<defs>``, and drawn with ``<use>`` where it was: one copy of the photo however many maps show it."""
    images = [(m, dict(_ATTRIBUTE.findall(m.group(1)))) for m in _IMAGE.finditer(svg)]
    shape = lambda a: (a.get("xlink:href"), a.get("width"), a.get("height"), a.get("style"))
    counts: dict[tuple, int] = {}
    for _, attributes in images:
        counts[shape(attributes)] = counts.get(shape(attributes), 0) + 1
    shared = {key: f"picture-{i}" for i, key in enumerate(k for k, n in counts.items() if n > 1)}
    if not shared:
        return svg
    parts, end = [], 0
    for match, attributes in images:
        key = shape(attributes)
        if key not in shared:
            continue
        placed = " ".join(f'{name}="{attributes[name]}"' for name in ("x", "y", "transform") if name in attributes)
        parts += [svg[end:match.start()], f'<use xlink:href="#{shared[key]}" {placed}/>']
        end = match.end()
    parts.append(svg[end:])
    body = "".join(parts)
    defs = "".join(f'<image id="{name}" xlink:href="{href}" width="{w}" height="{h}"'
                   + (f' style="{style}"' if style else "") + "/>\n" for (href, w, h, style), name in shared.items())
    return body.replace("<defs>", "<defs>\n" + defs, 1) if "<defs>" in body else re.sub(
        r"(<svg\b[^>]*>)", lambda m: m.group(1) + "\n<defs>" + defs + "</defs>", body, count=1)


def embed_fonts(svg: str, families: Sequence[str] = (LATIN_FONT, CJK_FONT), fallback: str | None = None) -> str:
    """``svg`` with an ``@font-face`` rule per font it uses, each a subset of the characters of its text;
    ``fallback``: one more font, holding just the characters that the first of ``families`` lacks."""
    import html

    characters = "".join(sorted({ch for m in _TEXT.finditer(svg) for ch in html.unescape(m.group(1))}))
    if not characters:
        return svg
    subsets = [(family, characters) for family in families
               if not (family == CJK_FONT and len(families) > 1 and not any(ord(ch) > 0x2E7F for ch in characters))]
    if fallback is not None:
        missing = "".join(ch for ch in characters if not ch.isspace() and ord(ch) not in _covered(families[0]))
        subsets += [(fallback, missing)] if missing else []
    rules = []
    for family, wanted in subsets:
        data = _subset(family, wanted)
        if data is not None:
            encoded = base64.b64encode(data).decode("ascii")
            rules.append(f"@font-face {{ font-family: '{family}'; src: url(data:font/otf;base64,{encoded}) "
                         "format('opentype'); }")
    style = '<style type="text/css">' + " ".join(rules) + "</style>\n"
    return svg.replace("<defs>", "<defs>\n" + style, 1) if "<defs>" in svg else re.sub(
        r"(<svg\b[^>]*>)", lambda m: m.group(1) + "\n<defs>" + style + "</defs>", svg, count=1)
