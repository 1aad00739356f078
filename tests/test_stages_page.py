"""A Swin checkpoint from the owner's folder on the page (issue #22): Stage and Block instead of Layer,
each stage's grid, windows outlined, a click makes a patch the query; both languages."""
from __future__ import annotations

import argparse
from urllib.parse import quote

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import serving
from conftest import APP

ARCH = "swin_tiny_patch4_window7_224"
CHOICE = f"ckpt:{ARCH}--random.safetensors"


@pytest.fixture(scope="module")
def swin_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("owner")
    torch.manual_seed(0)
    save_file(timm.create_model(ARCH, pretrained=False, num_classes=3).state_dict(), str(folder / f"{ARCH}--random.safetensors"))
    return folder


@pytest.fixture
def owner(swin_folder, monkeypatch):
    for name in (serving.ENV_DOWNLOADS, serving.ENV_MAX_PARAMS, serving.ENV_HEAVY_JOBS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(serving.ENV_CHECKPOINTS, str(swin_folder))
    return swin_folder


def test_a_swin_checkpoint_shows_stages_blocks_and_windows_in_both_languages(owner):
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = "en"
    at.run()
    at.selectbox(key="model_choice").set_value(CHOICE).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.selectbox(key="view").set_value("stages").run()  # one View box for every model: the stages are one view
    stage = at.selectbox(key="stage")
    assert len(stage.options) == 4 and stage.value == 3
    assert at.selectbox(key="stage_block_3").value == 1  # the last block of stage 4
    assert [s.key for s in at.slider] == ["alpha"]  # no Layer slider: Stage and Block replace it
    stage.set_value(0).run()
    assert at.selectbox(key="stage_block_0").value == 1  # stage 1's own box, at its last block
    assert at.selectbox(key="stage_block_0").format_func(1) == "Block 2 (shifted windows)"
    at.selectbox(key="stage_block_0").set_value(1).run()  # stage 1, block 2: shifted windows
    assert not at.exception
    info = " ".join(i.value for i in at.info)
    assert "has 4 stages" in info and "56 × 56, 28 × 28, 14 × 14, 7 × 7" in info
    assert "only to the tokens of its window (7 × 7)" in info and "shifts its windows by half" in info
    assert "pooled" not in info and "class token attends" not in info  # what Swin does not have is not said
    assert "Stage 1, block 2, mean of all heads: mean attention each patch receives within its window" in " ".join(
        h.value for h in at.subheader)
    captions = " ".join(c.value for c in at.caption)
    assert "averaged over the 49 patches of its window" in captions
    buttons = {b.label for b in at.get("download_button")}  # every (stage, block) to take away
    assert {"Download interactive page (HTML)", "Download the layer sweep (GIF)"} <= buttons, buttons
    at.radio(key="stage_show").set_value("matrix").run()  # block-diagonal in window order
    assert not at.exception and not at.error
    assert "the attention matrix, tokens in window order" in " ".join(h.value for h in at.subheader)
    assert ("each of the 64 windows is a 49 × 49 block on the diagonal, and between windows every weight is "
            "exactly 0. Drawn with each 4 × 4 square") in " ".join(c.value for c in at.caption)
    at.radio(key="stage_show").set_value("query").run()
    assert not at.exception
    assert "row 29, column 29" in " ".join(h.value for h in at.subheader)  # the middle of the 56 × 56 grid
    assert "shifted by 3 × 3 tokens" in " ".join(c.value for c in at.caption)
    at.radio(key="source").set_value("live").run()  # the live camera: Layer runs through every (stage, block)
    assert not at.exception and not at.error
    assert not [i.value for i in at.info if "stages" in i.value]  # no longer turned away
    from attnviz_app.live import layer_name  # the stream's Layer labels and its speed line

    model = attnviz.load_model(ARCH, 224, checkpoint=owner / f"{ARCH}--random.safetensors")
    assert [layer_name(model, n) for n in (1, 2, 3, 12)] == [
        "Stage 1, block 1", "Stage 1, block 2", "Stage 2, block 1", "Stage 4, block 2"]
    at.radio(key="source").set_value("sample").run()
    at.selectbox(key="lang").set_value("zh-TW").run()
    assert not at.exception
    assert at.selectbox(key="stage").label == "階段" and at.selectbox(key="stage_block_0").label == "區塊"
    assert "第 29 列、第 29 行" in " ".join(h.value for h in at.subheader)
    assert "平移了 3 × 3 個 token" in " ".join(c.value for c in at.caption)


def test_a_link_opens_a_swin_in_the_presenter_view_with_its_join_box_naming_it(owner, monkeypatch):
    """One View box for every model: a link's view, layer and query open on a Swin as on a ViT (layer 3 is stage 2,
    block 1, and the caption under Layer says so), and its join box names all of it; a link to the stages view
    names its own Stage and Block instead of the page's Layer and Head."""
    from attnviz_app import classroom

    encoded = []
    real = classroom.qr_png
    monkeypatch.setattr(classroom, "qr_png", lambda url: encoded.append(url) or real(url))
    monkeypatch.setenv("ATTNVIZ_JOIN_URL", "http://attnviz.school")
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"present": "1", "view": "query", "layer": "3", "photo": "rocket", "model": CHOICE,
                            "lang": "zh-TW"})
    at.run()  # one run: AppTest cannot run a Chinese page's select boxes again
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="model_choice").value == CHOICE and at.selectbox(key="view").value == "query"
    assert at.slider(key="layer").value == 3
    captions = " ".join(c.value for c in at.caption)
    assert "這一層是第 2 階段的第 1 個區塊：28 × 28 的 token 網格，在 16 個 7 × 7 的視窗內各自計算注意力。" in captions
    assert "白線框（查詢所在的視窗）之外的權重恰為 0" in captions  # the softmax runs inside the query's window
    assert any("`http://attnviz.school`" in m.value for m in at.markdown)  # the join box, as on a ViT
    said = {"view": "query", "layer": "3", "head": "mean", "query": "r15c15", "photo": "rocket", "model": CHOICE,
            "lang": "zh-TW"}
    assert at.query_params == {**said, "present": "1"}  # the middle of stage 2's 28 × 28 grid
    assert encoded[-1] == "http://attnviz.school/?" + "&".join(f"{k}={quote(v)}" for k, v in said.items())

    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"present": "1", "view": "stages", "photo": "rocket", "model": CHOICE, "lang": "zh-TW"})
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="stage").label == "階段"  # the stages view, in the language the link named
    # what the stages are sits one click away, leaving the projector's height to the picture
    about = [e for e in at.expander if e.label == "這個模型的階段與視窗"]
    assert about and "有 4 個階段" in " ".join(i.value for i in about[0].info)
    assert at.query_params == {"view": "stages", "photo": "rocket", "model": CHOICE, "lang": "zh-TW", "present": "1"}
    assert encoded[-1] == f"http://attnviz.school/?view=stages&photo=rocket&model={quote(CHOICE)}&lang=zh-TW"


def test_a_swin_link_opens_the_stage_block_head_and_query_patch_it_names(owner):
    """/?stage=2&block=1&head=3&show=query&query=r5c6: the Swin picture on the projector, not the last stage's
    summary; a value the model lacks (a fifth stage, a third block) is left out."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"view": "stages", "model": CHOICE, "stage": "2", "block": "1", "head": "3",
                            "show": "query", "query": "r5c6", "cmap": "viridis", "photo": "coffee"})
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.selectbox(key="stage").value == 1 and at.selectbox(key="stage_block_1").value == 0
    assert at.selectbox(key="stage_head").value == 3 and at.radio(key="stage_show").value == "query"
    assert at.selectbox(key="cmap").value == "viridis"
    titles = " ".join(h.value for h in at.subheader)
    assert "row 5, column 6" in titles and "Stage 2, block 1, head 3" in titles, titles
    assert at.query_params == {"view": "stages", "head": "3", "query": "r5c6", "cmap": "viridis", "stage": "2",
                               "block": "1", "show": "query", "photo": "coffee", "model": CHOICE, "lang": "en"}
    at.radio(key="stage_show").set_value("summary").run()  # the address follows the page
    assert "show" not in at.query_params and "query" not in at.query_params and at.query_params["stage"] == "2"

    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"model": CHOICE, "stage": "5", "block": "3", "head": "99", "show": "all"})
    at.run()  # no view named: a model with stages opens on its stages
    assert not at.exception and at.selectbox(key="stage").value == 3 and at.selectbox(key="stage_block_3").value == 1
    assert at.selectbox(key="stage_head").value == "mean" and at.radio(key="stage_show").value == "summary"
    assert at.query_params == {"view": "stages", "photo": "coffee", "model": CHOICE, "lang": "en"}


def test_the_page_numbers_are_the_library_numbers(owner):
    """What the page states for the query (its self-weight) is this capture's number, from the library."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = "en"
    at.run()
    at.selectbox(key="model_choice").set_value(CHOICE).run()
    at.selectbox(key="view").set_value("stages").run()
    at.selectbox(key="stage").set_value(1).run()
    at.selectbox(key="stage_block_1").set_value(1).run()
    at.session_state["stage_query"] = (3, 5)
    at.radio(key="stage_show").set_value("query").run()
    line = next(m.value for m in at.markdown if "attention to itself" in m.value)
    model = attnviz.load_model(ARCH, checkpoint=owner / f"{ARCH}--random.safetensors", device="cpu")
    from attnviz.photos import sample
    from PIL import Image

    cap = attnviz.capture(model, Image.open(sample(at.selectbox(key="sample").value)))
    layer = cap.layer_of(1, 1)
    m = cap.query_map(layer, "mean", 3 * 28 + 5)
    assert f"**{m[3, 5]:.4f}**" in line and f"**{np.max(m):.4f}**" in line


@pytest.mark.browser
def test_a_swin_checkpoint_end_to_end_in_a_real_browser(swin_folder):
    """Owner's folder → model box → Stage/Block → query click: the heading follows the clicked patch; a link to the
    Swin on the projector and a phone."""
    from serve import MEASURE, chromium, open_page, pick, quiet, require_chromium, settle, shot, streamlit_server

    require_chromium()
    env = {serving.ENV_CHECKPOINTS: str(swin_folder), "ATTNVIZ_JOIN_URL": "http://attnviz.school"}
    with streamlit_server(env=env) as (url, _), chromium() as browser:
        # the flow on a desktop and a phone (touch, a 390 px column); the projector opens the Swin by link below
        for name in ("desktop", "phone"):
            touch = name == "phone"
            page = open_page(browser, name, device_scale_factor=1)
            page.goto(url)
            page.locator(".st-key-model_choice input").wait_for(timeout=180_000)
            if touch:  # the phone starts with the sidebar closed
                page.locator("[data-testid='stExpandSidebarButton'], [data-testid='stSidebarCollapsedControl'] button").first.click()
            pick(page, "model_choice", "Checkpoint: swin_tiny")
            page.get_by_text("Layer = stage 4, block 2", exact=False).wait_for(timeout=180_000)  # under Layer
            if touch and page.locator("[data-testid='stSidebarCollapseButton'] button").count():
                page.locator("[data-testid='stSidebarCollapseButton'] button").first.click()  # close it again
                page.wait_for_timeout(500)
            pick(page, "view", "Stages and windows")  # one View box for every model: the stages are one view
            page.get_by_text("has 4 stages, each with its own grid", exact=False).wait_for(timeout=180_000)
            pick(page, "stage", "Stage 1 (56 × 56")
            page.get_by_text("Stage 1, block 2, mean of all heads", exact=False).wait_for(timeout=60_000)
            settle(page)
            shot(page, f"swin_summary_{name}")
            page.locator(".st-key-stage_show label").filter(has_text="One patch as the query").click()
            page.get_by_text("what patch (row 29, column 29) attends to", exact=False).wait_for(timeout=60_000)
            chart = page.locator("[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg").first
            chart.wait_for(timeout=60_000)
            settle(page)
            chart.scroll_into_view_if_needed()
            page.wait_for_function("e => e.getBoundingClientRect().height > 100", arg=chart.element_handle())  # drawn
            box = chart.bounding_box()
            # a tap in the top-left cell area: row and column 1…3 of 56
            page.mouse.click(box["x"] + box["width"] * 0.03, box["y"] + box["height"] * 0.03)
            try:
                page.get_by_text("what patch (row 2, column 2) attends to", exact=False).wait_for(timeout=60_000)
            finally:
                shot(page, f"swin_query_{name}")
            page.close()
        # a link opens the Swin (model=…): on the projector its picture, 500 px at 720, and the join box's QR code
        # fit the screen without a scroll; a phone opens at the top, as for a ViT, and its picture fits the screen
        # once the visitor scrolls to it
        for name, present in (("projector", "&present=1"), ("phone", "")):
            page = open_page(browser, name, device_scale_factor=1)
            page.goto(f"{url}/?photo=rocket&lang=zh-TW&model={quote(CHOICE)}{present}")
            page.locator(".st-key-stage input").wait_for(timeout=180_000)
            settle(page)
            quiet(page, 2)
            if not present:
                assert page.locator("h1").bounding_box()["y"] >= 0  # not scrolled on a first visit
                page.locator(".st-key-result [data-testid='stImage'] img").first.evaluate(
                    "e => e.scrollIntoView({block: 'nearest', behavior: 'instant'})")
            seen = page.evaluate(MEASURE)
            shot(page, f"swin_link_{name}")
            heat = seen["heat"]
            assert heat is not None and heat["top"] >= 0 and heat["bottom"] <= seen["vh"] + 1, seen
            if present:
                assert heat["height"] >= 480, seen
                qr = page.locator(".st-key-join img").bounding_box()
                assert qr["y"] >= 0 and qr["y"] + qr["height"] <= seen["vh"], (qr, seen)
            page.close()


def test_a_live_frame_of_a_swin_is_the_summary_map_at_its_stage_grid(swin_folder):
    """The camera's per-frame function on a staged model: the chosen (stage, block)'s summary map."""
    from conftest import ASSETS
    from PIL import Image

    from attnviz.live import LiveSettings, heatmap_frame

    model = attnviz.load_model(ARCH, 224, checkpoint=swin_folder / f"{ARCH}--random.safetensors")
    photo = Image.open(ASSETS / "cat.jpg")
    cap = attnviz.capture(model, photo)
    for layer, head, grid in ((1, 2, (56, 56)), (11, 23, (7, 7)), (0, 5, (56, 56))):  # head 5 > stage 1's 3: mean
        frame = heatmap_frame(photo, LiveSettings(model, layer=layer, head=head))
        expected = cap.summary_map(layer, head if head < cap.heads(layer) else "mean")
        assert frame.cls_map.shape == grid
        np.testing.assert_allclose(frame.cls_map, expected, atol=1e-6)


def _run(*words):
    """``attnviz WORDS`` in this process (the entry point's own ``main``): (exit status, stdout, stderr). The fresh
    process's entry point is tests/test_cli.py's; here a staged model goes through every command without paying
    for a new interpreter and its imports each time."""
    import contextlib
    import io

    from attnviz.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(words))
        except SystemExit as stop:  # argparse's usage errors
            status = stop.code
    return argparse.Namespace(returncode=status, stdout=out.getvalue(), stderr=err.getvalue())


LARGE_EXPORT_NOTE = ("note: --format full writes 277 MB of attention weights per photo for {ARCH} ({ARCH}--random.safetensors) "
                     "(every layer's N × N matrix); --format qk leaves them out and load_capture recomputes the same weights "
                     "from the queries and keys.\n").format(ARCH=ARCH)


def _export(swin_folder, out, *options):
    from conftest import ASSETS

    return _run("export", str(ASSETS / "cat.jpg"), "--out", str(out), "--quiet", "--model", ARCH, "--checkpoint",
                str(swin_folder / f"{ARCH}--random.safetensors"), "--device", "cpu", *options)


def test_export_of_a_swin_writes_its_stages_and_reads_back_the_same_weights(swin_folder, tmp_path):
    """``attnviz export`` of a staged model: per-layer queries and keys (qk) or weights (full), the layouts in
    the meta; load_capture gives a Capture whose every weight equals a fresh capture's."""
    from conftest import ASSETS
    from PIL import Image

    from attnviz.export import load_capture, read_meta

    out = tmp_path / "out"
    run = _export(swin_folder, out, "--format", "full", "--gif")
    assert run.returncode == 0, run.stderr
    saved = load_capture(out / "cat.npz")
    assert isinstance(saved, attnviz.Capture) and not saved.uniform and saved.stages == ((0, 1), (2, 3), (4, 5, 6, 7, 8, 9), (10, 11))
    model = attnviz.load_model(ARCH, 224, checkpoint=swin_folder / f"{ARCH}--random.safetensors")
    fresh = attnviz.capture(model, Image.open(ASSETS / "cat.jpg"))
    meta = read_meta(out / "cat.npz")
    assert meta["capture"]["type"] == "Capture"
    assert meta["attention"]["shapes"][0] == [3, 3136, 3136] and meta["attention"]["shapes"][-1] == [24, 49, 49]
    with np.load(out / "cat.npz") as z:
        for layer in (0, 1, 11):  # stage 1 unshifted and shifted, stage 4
            expected = fresh.layer_weights(layer)
            assert torch.equal(saved.layer_weights(layer), expected)
            np.testing.assert_allclose(z[f"attention.{layer}"], expected.numpy(), atol=1e-7)
            assert torch.equal(saved.layout(layer).windows, fresh.layout(layer).windows)
    assert saved.layout(1).shift == (3, 3) and saved.layout(1).grid == (56, 56)
    assert (out / "cat_overlay.png").is_file() and (out / "cat_layers.gif").is_file()
    with Image.open(out / "cat_layers.gif") as gif:
        assert gif.n_frames == 12  # one per (stage, block)


def test_export_of_a_swin_rolls_out_its_last_stage_and_refuses_rollout_across_stages(swin_folder, tmp_path):
    """--rollout multiplies matrices over one token set: a Swin's is its last stage (layers 11–12, 7 × 7); across a
    change of grid the library refuses in one sentence. --html writes the page."""
    from conftest import ASSETS
    from PIL import Image

    from attnviz.rollout import layer_flow, rollout_map

    out = tmp_path / "rollout"
    run = _export(swin_folder, out, "--rollout")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    model = attnviz.load_model(ARCH, 224, checkpoint=swin_folder / f"{ARCH}--random.safetensors")
    fresh = attnviz.capture(model, Image.open(ASSETS / "cat.jpg"))
    flows = [layer_flow(fresh.layer_weights(layer).double()) for layer in (10, 11)]  # (49, 49) each, rows sum to 1
    mean_patch_rows = torch.full((49,), 1 / 49, dtype=torch.float64) @ flows[1] @ flows[0]  # no class token
    with np.load(out / "cat.npz") as z:
        assert z["rollout"].shape == (7, 7)
        np.testing.assert_allclose(z["rollout"].ravel(), mean_patch_rows.numpy(), atol=1e-6)
    with pytest.raises(attnviz.LayoutError, match=r"layers 1–12 of this model attend over different token grids.*11–12"):
        rollout_map(fresh, 0, 11)
    out = tmp_path / "html"
    run = _export(swin_folder, out, "--html")
    assert run.returncode == 0 and run.stderr == LARGE_EXPORT_NOTE, run.stderr  # the size of --format full, said once
    text = (out / "cat.html").read_text(encoding="utf-8")
    assert '"staged": [{"stage": 1, "block": 1, "grid": [56, 56]' in text and "Stage 4, block 2" in text
    assert (out / "cat.npz").is_file() and (out / "cat_overlay.png").is_file()


SMALL_SWIN = {"img_size": 112, "depths": (2, 2), "embed_dim": 32, "num_heads": (2, 4)}


def page_arrays(text: str) -> tuple[dict, dict]:
    """(meta, {name: array}) read back from a page's payload, as its script unpacks them."""
    import base64
    import gzip
    import json
    import re

    meta = json.loads(re.search(r'<script type="application/json" id="meta">(.*?)</script>', text, re.S).group(1))
    packed = re.search(r'<script type="application/octet-stream" id="payload">(.*?)</script>', text, re.S).group(1)
    buffer = gzip.decompress(base64.b64decode(packed))
    arrays = {name: np.frombuffer(buffer, np.dtype(dtype), int(np.prod(shape)), offset).reshape(shape)
              for name, (offset, dtype, shape) in meta["index"].items()}
    return meta, arrays


@pytest.mark.browser
def test_a_small_swin_as_the_interactive_page_in_a_real_browser(tmp_path):
    """``attnviz export --html`` of a staged model: the Layer control names (stage, block), the drawn map is
    the layer's summary map at its own grid (payload, readout and pixels), a click shows that query's row,
    zero outside its window."""
    from conftest import ASSETS
    from PIL import Image
    from serve import chromium, require_chromium, shot

    from attnviz import cli, render

    require_chromium()
    torch.manual_seed(0)
    network = timm.create_model(ARCH, pretrained=False, **SMALL_SWIN).eval()
    model = attnviz.wrap(network, ARCH, "random init", 112)
    photo = Image.open(ASSETS / "cat.jpg")
    cap = attnviz.capture(model, photo)
    view = model.view(photo, "crop")
    out = tmp_path / "out"
    out.mkdir()
    args = argparse.Namespace(fit="crop", format="qk", dtype="float32", rollout=False, html=True, gif=False, lang="en")
    cli.export_one(model, ASSETS / "cat.jpg", out, "cat", args)
    path = out / "cat.html"
    meta, arrays = page_arrays(path.read_text(encoding="utf-8"))
    assert [(m["stage"], m["block"], m["grid"], m["heads"]) for m in meta["staged"]] == [
        (1, 1, [28, 28], 2), (1, 2, [28, 28], 2), (2, 1, [14, 14], 4), (2, 2, [14, 14], 4)]
    layer = 1  # stage 1, block 2: shifted windows
    for k, head in enumerate(["mean", "max", "min", 0, 1]):  # the payload's numbers are the library's
        expected = cap.summary_map(layer, head).reshape(-1)
        lo, hi = arrays[f"summary_lo.{layer}"][k], arrays[f"summary_hi.{layer}"][k]
        shown = lo + arrays[f"summary.{layer}"][k] / 255 * (hi - lo)
        np.testing.assert_allclose(shown, expected, atol=(hi - lo) / 510 * (1 + 1e-5) + 1e-9)

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        control = page.get_by_label("Stage, block", exact=True)
        assert control.get_attribute("type") == "range" and control.get_attribute("max") == "4"
        assert page.locator("#layer-value").inner_text() == "Stage 2, block 2"
        control.focus()
        page.keyboard.press("Home")
        page.keyboard.press("ArrowRight")  # → stage 1, block 2
        assert page.locator("#layer-value").inner_text() == "Stage 1, block 2"
        canvas = page.locator("#picture")
        assert canvas.get_attribute("data-layer") == str(layer) and canvas.get_attribute("data-keys") == "28x28"
        assert page.locator("#caption").inner_text().startswith("Stage 1, block 2, mean of all heads: where all patches")

        def pixels():
            data = page.evaluate("""() => { const c = document.getElementById('picture');
                return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }""")
            return np.array(data, dtype=np.uint8).reshape(112, 112, 4)[..., :3]

        # the drawn map is render.overlay of the summary map at the layer's 28 × 28 grid
        expected = np.asarray(render.overlay(view, cap.summary_map(layer, "mean")))
        assert np.abs(pixels().astype(int) - expected).max() <= 1
        def centre(row, col, grid):  # the caption above may wrap differently once a query is picked
            box = canvas.bounding_box()
            return box["x"] + (col + 0.5) * box["width"] / grid[1], box["y"] + (row + 0.5) * box["height"] / grid[0]

        summary = cap.summary_map(layer, "mean")
        for row, col in [(0, 0), (13, 20), (27, 27)]:
            page.mouse.move(*centre(row, col, (28, 28)))
            readout = page.locator("#readout")
            assert readout.get_attribute("data-key") == str(row * 28 + col)
            shown, tol = float(readout.get_attribute("data-value")), float(readout.get_attribute("data-tolerance"))
            assert abs(shown - summary[row, col]) <= tol * (1 + 1e-5) + 1e-9

        page.mouse.click(*centre(9, 4, (28, 28)))  # query = cell (row 10, col 5) of stage 1's grid
        query = 9 * 28 + 4
        assert canvas.get_attribute("data-query") == str(query)
        assert "where patch (row 10, column 5) looks" in page.locator("#caption").inner_text()
        row_map = cap.query_map(layer, "mean", query)
        inside = cap.window_mask(layer, query)
        assert not inside.all() and (row_map[~inside] == 0).all()
        expected = np.asarray(render.overlay(view, row_map))
        assert np.abs(pixels().astype(int)[~np.kron(inside, np.ones((4, 4), bool))] -
                      expected[~np.kron(inside, np.ones((4, 4), bool))]).max() <= 1  # outside the frame drawn
        outside = tuple(int(v) for v in np.argwhere(~inside)[0])
        for row, col in [(9, 4), (9, 6), outside]:
            page.mouse.move(*centre(row, col, (28, 28)))
            readout = page.locator("#readout")
            shown, tol = float(readout.get_attribute("data-value")), float(readout.get_attribute("data-tolerance"))
            assert abs(shown - row_map[row, col]) <= tol * (1 + 1e-5) + 1e-9
        page.mouse.move(*centre(*outside, (28, 28)))
        assert float(page.locator("#readout").get_attribute("data-value")) == 0.0  # outside the window: exactly 0
        shot(page, "swin_html_query")

        assert page.locator("#head option[value='6']").evaluate("o => o.disabled")  # stage 1 has 2 heads
        control.focus()
        page.keyboard.press("End")  # stage 2, block 2: the query moves to the same place on the 14 × 14 grid
        assert canvas.get_attribute("data-query") == str(4 * 14 + 2) and canvas.get_attribute("data-grid") == "14x14"
        page.get_by_label("Head", exact=True).select_option(label="head 4")
        assert canvas.get_attribute("data-head") == "6"
        control.focus()
        page.keyboard.press("Home")  # stage 1, where there is no head 4: back to the mean
        assert canvas.get_attribute("data-head") == "0" and page.locator("#head").input_value() == "0"
        assert errors == []


PHOTOS = ("cat.jpg", "rocket.jpg")


@pytest.fixture(scope="module")
def swin_run(swin_folder, tmp_path_factory):
    """``attnviz dataset`` of the Swin checkpoint on two photos: (the runs' root, the run, the command's result)."""
    import subprocess
    import sys

    from conftest import ASSETS, ROOT

    root = tmp_path_factory.mktemp("runs")
    photos = root / "photos"
    photos.mkdir()
    for name in PHOTOS:
        (photos / name).write_bytes((ASSETS / name).read_bytes())
    run = subprocess.run(
        [sys.executable, "-m", "attnviz", "dataset", str(photos), "--out", str(root / "swin-run"), "--quiet",
         "--model", ARCH, "--checkpoint", str(swin_folder / f"{ARCH}--random.safetensors")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    return root, root / "swin-run", run


def test_the_dataset_command_on_a_swin_writes_each_layers_own_heads_and_grid(swin_folder, swin_run):
    """One row per (image, layer, head) with each layer's own head count (3, 6, 12, 24 by stage), the keys' grid
    top_patch lies on, and statistics equal to an independent recomputation from the whole-image weights."""
    from PIL import Image

    from attnviz import runfiles
    from attnviz.dataset import read_run
    from attnviz.masks import DEFAULT_MASS
    from conftest import ASSETS

    _, out, run = swin_run
    assert run.returncode == 0, run.stderr
    tables = read_run(out)
    heads = tables.heads.to_pandas()
    per_layer = (3, 3, 6, 6, *(12,) * 6, 24, 24)
    grids = ((56, 56),) * 2 + ((28, 28),) * 2 + ((14, 14),) * 6 + ((7, 7),) * 2
    assert len(heads) == len(PHOTOS) * sum(per_layer)
    for image in heads.groupby("path"):
        rows = image[1]
        assert tuple(rows.groupby("layer")["head"].count()) == per_layer
        assert tuple(rows.groupby("layer")["head"].max() + 1) == per_layer
        assert [tuple(g) for g in rows.groupby("layer")[["keys_grid_h", "keys_grid_w"]].first().to_numpy()] == list(grids)
    assert (heads["top_patch"] < heads["keys_grid_h"] * heads["keys_grid_w"]).all()
    assert (heads["prefix_share"] == 0).all()  # Swin has no prefix token
    assert tables.images.to_pandas()[["grid_h", "grid_w", "input_size"]].drop_duplicates().values.tolist() == [[56, 56, 224]]
    opened = runfiles.open_run(out)
    assert opened.left_out == () and opened.heads_per_layer == per_layer and opened.layer_grids == grids
    assert (opened.num_layers, opened.num_heads, opened.staged) == (12, 24, True)

    model = attnviz.load_model(ARCH, 224, checkpoint=swin_folder / f"{ARCH}--random.safetensors")
    cap = attnviz.capture(model, Image.open(ASSETS / "cat.jpg"))
    cat = heads[heads["path"].str.endswith("cat.jpg")]
    for layer, head in ((1, 2), (4, 5), (11, 17)):  # stage 1 shifted, stage 3 unshifted, stage 4
        weights = cap.layer_weights(layer)[head].double().numpy()  # (N, N): every token is a query in Swin
        h, w = cap.layout(layer).keys_grid
        logs = np.where(weights > 0, np.log(np.where(weights > 0, weights, 1)), 0)
        entropy = -(weights * logs).sum(-1).mean()  # the mean over the layer's queries: no class token
        cells = (np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij"), -1).reshape(-1, 2) + 0.5) * (224 / h)
        dist = np.sqrt(((cells[:, None] - cells[None]) ** 2).sum(-1))  # (N, N) pixels between cell centres
        distance = ((weights * dist).sum(-1) / weights.sum(-1)).mean()
        received = (weights.sum(0) / 49).reshape(h, w)  # each patch from the 49 queries of its 7 × 7 window
        order = np.sort(received.ravel())[::-1]
        held = (int(np.searchsorted(np.cumsum(order) / order.sum(), DEFAULT_MASS - 1e-12)) + 1) / order.size
        row = cat[(cat["layer"] == layer) & (cat["head"] == head)].iloc[0]
        np.testing.assert_allclose(row["entropy"], entropy, rtol=1e-5)
        np.testing.assert_allclose(row["distance_px"], distance, rtol=1e-5)
        assert row["top_patch"] == int(np.argmax(received)) and (row["keys_grid_h"], row["keys_grid_w"]) == (h, w)
        assert row["mass60_fraction"] == pytest.approx(held)


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_the_dataset_page_shows_a_swin_run_on_each_layers_grid(swin_run, monkeypatch, lang):
    """The page reads the run: every head in the chart, a layer's own heads in the Head box, its maps at its grid."""
    from attnviz import i18n
    from attnviz.dataset import read_run

    root, out, run = swin_run
    assert run.returncode == 0, run.stderr
    monkeypatch.setenv("ATTNVIZ_DATASETS", str(root))
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = lang
    at = at.switch_page("screens/dataset.py").run()
    assert not at.exception and not at.error and not at.warning, [e.value for e in [*at.exception, *at.error, *at.warning]]
    assert at.selectbox(key="dataset_run").value == str(out)
    assert len(at.get("vega_lite_chart")) == 1
    infos = " ".join(i.value for i in at.info)
    comma = {"en": ", ", "zh-TW": "、"}[lang]  # a list in a Chinese sentence takes the enumeration comma
    assert i18n.text(lang, "dataset.staged_note", heads=comma.join(["3", "6", "12", "24"]),
                     grids=comma.join(["56 × 56", "28 × 28", "14 × 14", "7 × 7"])) in infos
    assert i18n.text(lang, "dataset.qk_staged") in infos
    assert at.selectbox(key="dataset_head.24").options == [str(n) for n in range(1, 25)]  # layer 12: stage 4
    if lang != "en":  # AppTest formats a translated radio's value outside the session, in English: not set again
        return
    at.selectbox(key="dataset_layer").select(2).run()  # stage 1, block 2: 3 heads at 56 × 56
    assert not at.exception and not at.warning, [e.value for e in [*at.exception, *at.warning]]
    head_box = at.selectbox(key="dataset_head.3")
    assert head_box.options == ["1", "2", "3"]
    head_box.select(3).run()
    heads = read_run(out).heads.to_pandas()
    rows = heads[(heads["layer"] == 1) & (heads["head"] == 2)].sort_values(["distance_px", "path"])
    captions = [img.caption for el in at.get("image") for img in el.proto.imgs]
    assert [c.split(" · ")[0] for c in captions] == [p.rsplit("/", 1)[1] for p in rows["path"]]
    assert f"{rows['distance_px'].iloc[0]:.1f}" in captions[0]
    assert i18n.text(lang, "dataset.maps_note_staged", layer=2, head=3, h=56, w=56) in " ".join(c.value for c in at.caption)


@pytest.mark.parametrize("lang, said", [
    ("en", "has 12 layers in 4 stages with their own grids (56 × 56, 28 × 28, 14 × 14, 7 × 7)"),
    ("zh-TW", "的 12 層分成 4 個階段，各有自己的網格（56 × 56、28 × 28、14 × 14、7 × 7）")])
def test_the_lesson_on_a_swin_says_in_one_sentence_what_it_follows_and_never_fails(owner, lang, said):
    """The lesson follows one N × N matrix per layer over one grid (issue #45 saw Streamlit's error box here)."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = lang
    at.query_params.update({"model": CHOICE})
    at.switch_page("screens/lesson.py").run()
    assert not at.exception and not at.error, [e.value for e in at.exception] + [e.value for e in at.error]
    info = " ".join(i.value for i in at.info)
    assert said in info, info
    assert not at.latex  # no step drawn from a matrix the model does not have


def test_faithfulness_with_head_ablation_on_a_small_swin_writes_each_layers_own_heads(tmp_path, monkeypatch):
    """attnviz faithfulness --fill mean --ablation on a model with stages: every map ranked on the photo's patches,
    the ablation grid as each layer's own heads, the JSON free of NaN (a small Swin, in process; the same command
    on a Swin-T checkpoint is the acceptance check's)."""
    import json

    from conftest import ASSETS

    from attnviz import cli

    torch.manual_seed(0)
    network = timm.create_model(ARCH, pretrained=False, num_classes=3, img_size=112, depths=(2, 2), embed_dim=32,
                                num_heads=(2, 4)).eval()
    small = attnviz.wrap(network, "small swin", "random init", 112)
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: small)
    out = tmp_path / "f.json"
    assert cli.main(["faithfulness", str(ASSETS / "cat.jpg"), "--fill", "mean", "--ablation", "--random", "2",
                     "--json", str(out), "--quiet"]) == 0
    record = json.loads(out.read_text())  # strict JSON: a NaN would not parse back as a number list
    assert [len(row) for row in record["ablation"]] == [2, 2, 4, 4]
    assert [len(row) for row in record["head_entropy"]] == [2, 2, 4, 4]
    assert record["num_patches"] == 28 * 28 and "attention rollout" in [m["name"] for m in record["maps"]]
    assert all(sorted(m["order"]) == list(range(28 * 28)) for m in record["maps"])


def _command(swin_folder, *words):
    return _run(*words, "--model", ARCH, "--checkpoint", str(swin_folder / f"{ARCH}--random.safetensors"))


def test_every_command_runs_on_a_swin_or_says_one_line(swin_folder, tmp_path, monkeypatch):
    """figure, qk (a layer with global attention; a windowed one: one line, exit 2), faithfulness's token fill (one
    line), and export --html --rollout, on a Swin-T checkpoint, through the command line's main."""
    import json

    from conftest import ASSETS

    monkeypatch.setenv("ATTNVIZ_RUNTIME", "pytorch")
    photo = str(ASSETS / "cat.jpg")
    run = _command(swin_folder, "figure", photo, "--out", str(tmp_path / "fig.svg"), "--views", "cls,rollout,heads",
                   "--layers", "2,12")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    svg = (tmp_path / "fig.svg").read_text()
    assert "L12 · head 24" in svg and "L2 · head 3" in svg and "L2 · head 4" not in svg  # each layer's own heads
    run = _command(swin_folder, "qk", photo, "--layer", "12", "--head", "24", "--json", str(tmp_path / "qk.json"))
    assert run.returncode == 0, run.stderr
    assert len(json.loads((tmp_path / "qk.json").read_text())["points"]) == 2 * 49  # stage 4: one 7 × 7 window
    run = _command(swin_folder, "qk", photo, "--layer", "2", "--head", "1", "--json", str(tmp_path / "qk2.json"))
    assert run.returncode == 2 and "Traceback" not in run.stderr and not (tmp_path / "qk2.json").exists()
    assert run.stderr.strip().splitlines() == [
        "error: layer 2 attends inside 64 windows of 7 × 7 tokens, so its queries and keys are not one set of points that "
        "attend to each other; the Q/K map needs a layer with global attention (this model's layers 11, 12 have)"]
    run = _command(swin_folder, "faithfulness", photo, "--fill", "token", "--json", str(tmp_path / "t.json"))
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "is a timm Swin model" in run.stderr
    run = _export(swin_folder, tmp_path / "out", "--html", "--rollout")
    assert run.returncode == 0 and run.stderr == LARGE_EXPORT_NOTE, run.stderr
    assert (tmp_path / "out" / "cat.html").is_file()


STAGED_KINDS = [  # one model of each layout kind, random weights (tests/test_zoo.py checks their numbers)
    "swin_tiny_patch4_window7_224",  # windows, shifted; four grids
    "cait_xxs24_224",  # talking heads, then class attention: the class token the only query
    "levit_128s",  # pooled queries and keys; heads that meet in no Linear
    "pvt_v2_b0",  # keys on a coarser grid
]


@pytest.mark.parametrize("name", STAGED_KINDS)
def test_every_view_opens_by_link_on_each_layout_kind(name, tmp_path, monkeypatch):
    """/?model=ckpt:…&view=V at the first and the last layer: the view draws, or says in one sentence (an info box)
    what that layer lacks; never an exception or an error box."""
    from attnviz_app import views

    torch.manual_seed(0)
    network = timm.create_model(name, pretrained=False, num_classes=3)
    save_file(network.state_dict(), str(tmp_path / f"{name}--small.safetensors"))
    for env in (serving.ENV_DOWNLOADS, serving.ENV_MAX_PARAMS, serving.ENV_HEAVY_JOBS):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv(serving.ENV_CHECKPOINTS, str(tmp_path))
    layers = attnviz.wrap(network.eval(), name, "random init", 224).depth
    drawn = {}
    for view in views.registered():
        for layer in (1, layers):
            at = AppTest.from_file(APP, default_timeout=300)
            at.query_params.update({"model": f"ckpt:{name}--small.safetensors", "view": view, "layer": str(layer),
                                    "lang": "en"})
            at.run()
            assert not at.exception and not at.error, (view, layer, [e.value for e in at.exception],
                                                         [e.value for e in at.error])
            assert at.selectbox(key="view").value == view and at.selectbox(key="model_choice").value.startswith("ckpt:")
            drawn[view, layer] = (len(at.get("image")) + len(at.get("vega_lite_chart")) + len(at.info)
                                  + len(at.subheader) + len(at.get("button")))
    assert all(drawn.values()), [k for k, v in drawn.items() if not v]  # something drawn or said each time


def test_a_448_px_swin_matrix_link_builds_the_windows_blocks_not_the_whole_image(owner):
    """/?model=ckpt:…&size=448&view=stages&stage=1&block=1&show=matrix (issue #47): stage 1 is 12544 tokens, whose
    whole-image matrix is 3 × 12544² (1.9 GB); the page builds the first windows' blocks, at most MATRIX_CELLS
    weights, and they are the capture's own window weights."""
    import psutil

    from attnviz_app.views import stages

    process = psutil.Process()
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"model": CHOICE, "size": "448", "view": "stages", "stage": "1", "block": "1",
                            "show": "matrix", "lang": "en"})
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    before = process.memory_info().rss
    at.run()  # again, as every rerun of that page does: never the dense matrix
    assert process.memory_info().rss - before < 500 * 2**20
    assert "Shown: the first 83 of the 256 windows" in " ".join(c.value for c in at.caption)
    model = attnviz.load_model(ARCH, 448, checkpoint=owner / f"{ARCH}--random.safetensors")
    from attnviz.photos import sample
    from PIL import Image

    cap = attnviz.capture(model, Image.open(sample(at.selectbox(key="sample").value)))
    count = cap.windows_that_fit(0, stages.MATRIX_CELLS)
    blocks = cap.ordered_weights(0, "mean", count)
    assert count == 83 and blocks.shape == (83 * 49, 83 * 49) and blocks.size <= stages.MATRIX_CELLS
    windows = cap.window_weights(0).mean(1)  # (W, 49, 49): each window's own softmax, heads averaged
    for w in (0, 41, 82):  # block w on the diagonal is window w; beside it, exact zeros
        np.testing.assert_allclose(blocks[w * 49:(w + 1) * 49, w * 49:(w + 1) * 49], windows[w].numpy(), atol=1e-7)
    assert not blocks[:49, 49:].any()


def test_the_page_says_how_a_class_attention_layer_attends(tmp_path, monkeypatch):
    """CaiT's layer 26 (class attention): the Layer caption said "every token attending to every token" and the Q/K
    map said no layer had every token attending to every other; its layers 1–24 do, with talking heads."""
    torch.manual_seed(0)
    save_file(timm.create_model("cait_xxs24_224", pretrained=False, num_classes=3).state_dict(),
              str(tmp_path / "cait_xxs24_224--small.safetensors"))
    for env in (serving.ENV_DOWNLOADS, serving.ENV_MAX_PARAMS, serving.ENV_HEAVY_JOBS):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv(serving.ENV_CHECKPOINTS, str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"model": "ckpt:cait_xxs24_224--small.safetensors", "view": "qkmap", "layer": "26",
                            "lang": "en"})
    at.run()
    assert not at.exception and not at.error
    captions = " ".join(c.value for c in at.caption)
    assert ("Layer = stage 2, block 2: a 14 × 14 grid of tokens, only the class token asking (class attention: 1 of "
            "197 tokens).") in captions
    assert [i.value for i in at.info] == [
        "Layer 26 has only its class token as a query (class attention: 1 of its 197 tokens asks). Every token attends "
        "to every other in layers 1–24, but there a weight is not the softmax of one q · k (the heads' logits are mixed "
        "before the softmax, as talking heads do, or the softmax is blended with fixed weights): this model has no layer "
        "whose queries and keys are the one set of points the Q/K map draws."]
