"""A capture as one self-contained interactive HTML page: the photo, every layer and head, the controls.

The page needs no network and no library: the photo is a PNG data URL, the attention a gzip
stream unpacked by the browser's own ``DecompressionStream``, the drawing a ``<canvas>``.

What it holds, per layer and head choice (head 1…H, mean, max, min; K = H + 3):
- the class token's map over the P = h · w patches, and, while N is small enough
  (:data:`ALL_ROWS_BYTES`), the map of every query token: (L, K, N, P) rows;
- each row quantised to 8 bits between its own smallest and largest weight, which are stored exactly
  (float32). A shown colour is exactly the colour :func:`attnviz.render.overlay` draws, and a shown
  number lo + q / 255 · (hi − lo) is within (hi − lo) / 510 of the weight.

A model whose layers differ in grid, heads or windows (Swin, PiT, LeViT, …: not :attr:`Capture.uniform`) gets the same page
with every layer at its own grid: the Layer control names (stage, block), the map is drawn at that
layer's keys' grid and a click picks a cell of its query grid (:mod:`attnviz.html_stages` holds what
differs).
"""
from __future__ import annotations

import base64
import gzip
import html as htmlmod
import io
import json
import re
from importlib import resources

import numpy as np
import torch
from PIL import Image

import attnviz.atomic as atomic
import attnviz.html_stages as html_stages
import attnviz.i18n as i18n
import attnviz.render as render
from ._version import __version__
from .capture import Capture, fuse_heads
from .softmax import HEAD_FUSIONS

ALL_ROWS_BYTES = 8_000_000  # every query's rows up to this many raw bytes (224 px: 7.1 MB → ~5 MB page)
GZIP_LEVEL = 6  # level 9 saves 1 % more and takes three times as long
PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")  # {{NAME}} in templates/page.html


def head_choices(num_heads: int) -> list:
    """The Head options in page order: mean, max, min, then 0 … H − 1."""
    return [*HEAD_FUSIONS, *range(num_heads)]


def summary_map(cap: Capture, layer: int, head) -> np.ndarray:
    """(h, w): the map the page starts from — the class token's row, or without a class token the mean
    attention each patch receives (:meth:`Capture.summary_map` decides and says which)."""
    return cap.summary_map(layer, head)


def all_rows_bytes(cap: Capture) -> int:
    """Raw size of every query token's quantised rows: L · K · N · P bytes (staged: each layer's window rows)."""
    if not cap.uniform:
        return html_stages.all_rows_bytes(cap)
    h, w = cap.grid
    return cap.num_layers * (cap.num_heads + 3) * cap.num_tokens * h * w


def estimated_mb(cap: Capture) -> float:
    """About how large :func:`page` will be, in MB, without building it (gzip keeps ~57 % of the rows)."""
    rows = all_rows_bytes(cap)
    if not cap.uniform:
        rows = html_stages.summary_bytes(cap) + (rows if rows <= ALL_ROWS_BYTES else 0)
    elif rows > ALL_ROWS_BYTES:  # the class token's rows only
        h, w = cap.grid
        rows = cap.num_layers * (cap.num_heads + 3) * h * w
    photo = 3 * cap.input.shape[-1] ** 2 * 0.6  # PNG of the S × S photo
    return (rows * 0.57 + photo) * 4 / 3 / 1e6 + 0.05


def _quantise(rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(..., P) float → (uint8 levels, lo, hi): 256 levels between each row's min and max, as render.colorize."""
    rows = rows.float()
    lo = rows.amin(-1, keepdim=True)
    hi = rows.amax(-1, keepdim=True)
    span = hi - lo
    unit = torch.where(span > 0, (rows - lo) / torch.where(span > 0, span, 1), 0.0)
    levels = (unit * 255).round().to(torch.uint8)
    return levels.numpy(), lo[..., 0].numpy(), hi[..., 0].numpy()


def _summary_rows(cap: Capture) -> torch.Tensor:
    """(L, K, P) float32: the start map of every layer and head choice."""
    heads = head_choices(cap.num_heads)
    return torch.stack([
        torch.stack([torch.from_numpy(np.ascontiguousarray(summary_map(cap, layer, h))).reshape(-1) for h in heads])
        for layer in range(cap.num_layers)
    ])


def _query_rows(cap: Capture, layer: int) -> torch.Tensor:
    """(K, N, P) float32: every query token's row over the patches, for each head choice of one layer."""
    weights = cap.layer_weights(layer)[:, :, cap.num_prefix_tokens:].cpu()  # (H, N, P)
    return torch.stack([fuse_heads(weights, h) for h in head_choices(cap.num_heads)])


class _Blob:
    """Arrays packed one after another (4-byte aligned, so the page can view float32 in place)."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.index: dict[str, list] = {}

    def add(self, name: str, array: np.ndarray) -> None:
        pad = -self.buffer.tell() % 4
        self.buffer.write(b"\0" * pad)
        array = np.ascontiguousarray(array)
        self.index[name] = [self.buffer.tell(), array.dtype.str.lstrip("<|"), list(array.shape)]
        self.buffer.write(array.tobytes())


def _staged_payload(blob: _Blob, cap: Capture, all_rows: bool) -> None:
    """Each layer's arrays under ``name.{layer}``: its grid, head count and windows are its own."""
    for layer in range(cap.num_layers):
        levels, lo, hi = _quantise(html_stages.summary_rows(cap, layer))  # (K, P), (K,), (K,)
        blob.add(f"summary_lo.{layer}", lo)
        blob.add(f"summary_hi.{layer}", hi)
        blob.add(f"summary.{layer}", levels)
        lay = cap.layout(layer)
        if all_rows and html_stages.patch_queries(lay):
            levels, lo, hi = html_stages.window_rows(cap, layer)  # (K, W, Tq, Tk), (K, W, Tq) twice
            blob.add(f"rows_lo.{layer}", lo)
            blob.add(f"rows_hi.{layer}", hi)
            blob.add(f"rows.{layer}", levels)
            blob.add(f"windows.{layer}", lay.windows.cpu().numpy().astype(np.int32))  # (W, Tq) query tokens
            blob.add(f"keys.{layer}", lay.keys.cpu().numpy().astype(np.int32))  # (W, Tk) key tokens


def payload(cap: Capture, all_rows: bool | None = None) -> tuple[bytes, dict]:
    """(gzip bytes, index {name: [offset, dtype, shape]}) of the quantised maps."""
    blob = _Blob()
    if all_rows is None:
        all_rows = all_rows_bytes(cap) <= ALL_ROWS_BYTES
    if not cap.uniform:
        _staged_payload(blob, cap, all_rows)
        return gzip.compress(blob.buffer.getvalue(), GZIP_LEVEL, mtime=0), blob.index
    levels, lo, hi = _quantise(_summary_rows(cap))  # (L, K, P), (L, K), (L, K)
    blob.add("summary_lo", lo)
    blob.add("summary_hi", hi)
    blob.add("summary", levels)
    if all_rows:
        parts = [_quantise(_query_rows(cap, layer)) for layer in range(cap.num_layers)]
        blob.add("rows_lo", np.stack([p[1] for p in parts]))  # (L, K, N)
        blob.add("rows_hi", np.stack([p[2] for p in parts]))
        blob.add("rows", np.stack([p[0] for p in parts]))  # (L, K, N, P)
    return gzip.compress(blob.buffer.getvalue(), GZIP_LEVEL, mtime=0), blob.index


def _png_data_url(picture: Image.Image) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _colour_tables() -> dict[str, str]:
    """Each colour map's 256 RGB steps exactly as :func:`attnviz.render.colorize` uses them (base64)."""
    ramp = np.linspace(0.0, 1.0, 256)
    return {name: base64.b64encode(render.colorize(ramp, name).tobytes()).decode("ascii") for name in render.COLORMAPS}


def _strings(lang: str) -> dict[str, str]:
    prefix = "takeaway."
    return {k[len(prefix):]: v for k, v in i18n.catalogue(lang).items() if k.startswith(prefix)}


def _picture(cap: Capture, picture: Image.Image | None) -> Image.Image:
    if picture is not None:
        return picture.convert("RGB")
    if cap.prepared is None:
        raise ValueError("this capture does not record how its input was normalised; pass picture=")
    return cap.prepared.picture(cap.input)


def _staged_facts(cap: Capture, strings: dict, view: Image.Image, fit: str, lang: str) -> list[tuple[str, str]]:
    firsts = [cap.layout(s[0]) for s in cap.stages]
    h, w = firsts[0].grid
    return [
        (strings["fact_input"], strings["fact_input_value"].format(size=view.width, fit=strings[f"fit_{fit}"], h=h, w=w)),
        (strings["fact_stages"], strings["fact_stages_value"].format(
            n=len(firsts), grids=i18n.join(lang, (f"{lay.grid[0]} × {lay.grid[1]}" for lay in firsts)))),
        (strings["fact_layers"], strings["fact_layers_staged_value"].format(
            layers=cap.num_layers, heads=i18n.join(lang, (lay.num_heads for lay in firsts)))),
    ]


def page(
    cap: Capture,
    lang: str = i18n.DEFAULT,
    *,
    source: str | None = None,
    top: list[tuple[str, float]] | None = None,
    picture: Image.Image | None = None,
    all_rows: bool | None = None,
) -> str:
    """The whole interactive page for ``cap`` as one HTML string.

    Args:
        lang: ``"en"`` or ``"zh-TW"``.
        source: the photo's file name, shown in the title.
        top: the model's top classes ``[(label, probability), …]`` (``Model.top_classes``).
        picture: the S × S photo the model saw; by default recovered from ``cap.input``.
        all_rows: keep every query token's rows (clickable patches); by default while they fit
            :data:`ALL_ROWS_BYTES`, else only the class token's (staged: only each layer's summary map).
    """

    strings = _strings(lang)
    staged = not cap.uniform
    if staged and any(cap.summary_kind(layer) == "cls" for layer in range(cap.num_layers)):
        strings = {**strings, "query_mean_received": strings["query_mean_received_block"]}  # some blocks have one
    elif not cap.has_class_token:  # the start map is the mean attention received, and must say so
        strings = {**strings, "query_cls": strings["query_mean_received"], "reset": strings["reset_mean_received"]}
    view = _picture(cap, picture)
    data, index = payload(cap, all_rows)
    prep = cap.prepared
    if staged:
        last = cap.layout(cap.num_layers - 1)
        h, w = last.keys_grid
        num_heads = max(lay.num_heads for lay in cap.layouts)
        num_tokens, has_rows = last.num_tokens, any(name.startswith("rows.") for name in index)
    else:
        h, w = cap.grid
        num_heads, num_tokens, has_rows = cap.num_heads, cap.num_tokens, "rows" in index
    meta = {
        "layers": cap.num_layers, "heads": num_heads, "grid": [h, w], "tokens": num_tokens,
        "prefix": cap.num_prefix_tokens, "size": view.width, "index": index, "allRows": has_rows,
        "reducedMB": round(all_rows_bytes(cap) * 0.57 * 4 / 3 / 1e6),  # gzip keeps ~57 %, base64 adds a third
        "display": render.enlarge(view, 448).width,
    }
    if staged:
        meta["staged"] = html_stages.meta(cap, has_rows)
    title = strings["title_source"].format(source=source) if source else strings["title"]
    fit = prep.fit if prep is not None and prep.fit else "none"
    facts = [(strings["fact_model"], prep.model if prep is not None else "—")]
    if staged:
        facts += _staged_facts(cap, strings, view, fit, lang)
    else:
        facts += [
            (strings["fact_input"], strings["fact_input_value"].format(
                size=view.width, fit=strings[f"fit_{fit}"], h=h, w=w)),
            (strings["fact_tokens"], strings["fact_tokens_value"].format(
                n=cap.num_tokens, prefix=cap.num_prefix_tokens, patches=h * w)),
            (strings["fact_layers"], strings["fact_layers_value"].format(
                layers=cap.num_layers, heads=cap.num_heads, dk=cap.layouts[0].head_dim)),
        ]
    if source:
        facts.insert(0, (strings["fact_source"], source))
    esc = htmlmod.escape
    facts_html = "".join(f"<dt>{esc(k)}</dt><dd>{esc(str(v))}</dd>" for k, v in facts)
    top_html = ""
    if top:
        items = "".join(f"<li>{esc(label)} <span>{p:.3f}</span></li>" for label, p in top)
        top_html = f"<h2>{esc(strings['top5'])}</h2><ol class=top>{items}</ol>"
    head_options = "".join(
        f'<option value="{i}">{esc(strings[f"head_{h}"] if isinstance(h, str) else strings["head_n"].format(n=h + 1))}'
        "</option>" for i, h in enumerate(head_choices(num_heads))
    )
    cmap_options = "".join(f'<option value="{c}">{c}</option>' for c in render.COLORMAPS)

    def script_json(value) -> str:  # safe inside <script>: no "</" can end the element early
        return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")

    last = cap.layout(cap.num_layers - 1) if staged else None
    layer_value = strings["stage_block"].format(stage=last.stage + 1, block=last.block + 1) if staged else str(cap.num_layers)
    fill = {
        "LANG": esc(lang), "TITLE": esc(title), "LAYER": esc(strings["layer_staged" if staged else "layer"]),
        "LAYER_VALUE": esc(layer_value), "HEAD": esc(strings["head"]),
        "OPACITY": esc(strings["opacity"]), "COLORMAP": esc(strings["colormap"]),
        "HOVER": esc(strings["hover_query"]), "RESET": esc(strings["reset"]), "HOW": esc(strings["how"]),
        "FACTS_TITLE": esc(strings["facts"]), "FACTS": facts_html, "TOP": top_html,
        "PRECISION": esc(strings["precision"]), "MADE_WITH": esc(strings["made_with"].format(version=__version__)),
        "LOADING": esc(strings["loading"]), "NO_JS": esc(strings["no_js"]),
        "PICTURE_LABEL": esc(strings["picture_label"]),
        "LAYERS": str(cap.num_layers), "HEAD_OPTIONS": head_options, "CMAP_OPTIONS": cmap_options,
        "META": script_json(meta), "STRINGS": script_json(strings), "LUTS": script_json(_colour_tables()),
        "PHOTO": _png_data_url(view), "PAYLOAD": base64.b64encode(data).decode("ascii"),
    }
    template = resources.files("attnviz").joinpath("templates/page.html").read_text(encoding="utf-8")
    # one pass over the template: a value that contains "{{PAYLOAD}}" (a photo's name) stays that text
    return PLACEHOLDER.sub(lambda m: fill[m.group(1)], template)


def in_iframe(doc: str) -> str:
    """``doc`` inside an ``<iframe srcdoc>``: a notebook keeps the page's ids and styles apart from its own."""
    return (f'<iframe srcdoc="{htmlmod.escape(doc, quote=True)}" style="width:100%;height:980px;border:0" '
            'title="attnviz" sandbox="allow-scripts"></iframe>')


def notebook_html(cap: Capture, lang: str = i18n.DEFAULT, **kwargs) -> str:
    """What a notebook shows for ``cap``: :func:`page` in an iframe."""
    return in_iframe(page(cap, lang, **kwargs))


# Jupyter shows a capture as the interactive page `show` gives. The drawing side attaches the display
# (BertViz's split: a capture is plain data and does not know how it is drawn).
Capture._repr_html_ = notebook_html


class Page:
    """An interactive page that notebooks display; ``.html`` is the standalone document, ``.save(path)`` writes it."""

    def __init__(self, cap: Capture, lang: str = i18n.DEFAULT, **kwargs) -> None:
        self.html = page(cap, lang, **kwargs)

    def _repr_html_(self) -> str:
        return in_iframe(self.html)

    def save(self, path) -> None:
        atomic.write_text(path, self.html)  # whole or not at all


def show(cap: Capture, lang: str = i18n.DEFAULT, **kwargs) -> Page | None:
    """Show ``cap`` as the interactive page in Jupyter (displayed at once); elsewhere return the :class:`Page`."""
    shown = Page(cap, lang, **kwargs)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return shown
    if get_ipython() is None:
        return shown
    display(shown)
    return None
