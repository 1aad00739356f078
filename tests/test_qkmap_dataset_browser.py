"""The Dataset page's Q/K map and patch search in a real browser, at desktop, projector (1280 × 720) and phone
(390 × 844, touch) sizes, in English and 繁體中文: the measured sentence and the patch search's matches
against a recomputation by hand, the map (the WebGL scatter) drawn inside the screen, and no page wider than the
screen."""
from __future__ import annotations

from pathlib import Path

import pytest

import attnviz
from attnviz import i18n
from attnviz.dataset import RunConfig, run_local
from dataset_fixtures import SMALL, one_thread, photo_folder  # noqa: F401 (autouse fixture)
from serve import SCREENS, SHOTS, chromium, require_chromium, settle, shot, streamlit_server
from test_qkmap_browser import pick
from test_qkmap_dataset_page import by_hand
from conftest import Q, K, SCALE

SECTION = "[data-testid='stVerticalBlock']:has(> div .st-key-dataset_qk_colour)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_chromium()
    root = tmp_path_factory.mktemp("qkbrowser")
    run_local(photo_folder(root / "in"), root / "kept", RunConfig(size=SMALL, store="qk"), progress=False)
    with streamlit_server(env={"ATTNVIZ_DATASETS": str(root)}) as (url, _proc), chromium() as browser:
        yield url, browser, root


def expected_matches(root: Path, lang: str, photo: int, row: int, col: int, count: int = 3) -> list[str]:
    """The patch search's first captions, by hand: photo ``photo``'s query of patch (row, col), 1-based, on the
    4 × 4 grid, against every patch key of the other photos of layer 12, head 1; the largest q·k·scale first."""
    stored, paths = attnviz.qkmap.run_captures(root / "kept")
    q = Q(stored[photo])[11, 0, 1 + (row - 1) * 4 + (col - 1)].double()
    found = sorted(((float(K(stored[i])[11, 0, j].double() @ q) * SCALE(stored[0]), i, j)
                    for i in range(len(stored)) if i != photo for j in range(1, 17)), reverse=True)[:count]
    return [i18n.text(lang, "qkmap.search_match", rank=rank, name=Path(paths[i]).name, logit=logit,
                      patch=i18n.text(lang, "analysis.patch", row=(j - 1) // 4 + 1, col=(j - 1) % 4 + 1))
            for rank, (logit, i, j) in enumerate(found, 1)]


@pytest.mark.browser
# Every screen once and each language (not every pair: tests/test_qkmap_dataset_page.py proves the words in both
# languages through AppTest); the phone, the narrowest, in English, the longer of the two.
@pytest.mark.parametrize("where, lang", [("desktop", "zh-TW"), ("projector", "en"), ("phone", "en")])
def test_dataset_qk_map_and_patch_search(server, where, lang):
    url, browser, root = server
    context = browser.new_context(**SCREENS[where])
    page = context.new_page()
    page.goto(url + ("/dataset?lang=zh-TW" if lang == "zh-TW" else "/dataset"))  # a link names the language
    page.locator(".st-key-dataset_qk_colour").wait_for(timeout=180_000)
    settle(page)
    header = i18n.text(lang, "qkmap.dataset_header", layer=12, head=1)
    page.get_by_text(header).wait_for(timeout=60_000)
    pick(page, "dataset_qk_normalize", i18n.text(lang, "qkmap.normalize_none"))  # the raw q and k, as by_hand has them
    _, rho = by_hand(root, 11, 0)
    text = page.locator("[data-testid='stMain']").inner_text()
    assert f"{rho:+.2f}" in text, text
    assert i18n.text(lang, "qkmap.dataset_caption", photos=4, points=4 * 2 * 17) in text

    # Pick a patch: row 3 of the first photo (column 2, the box's middle default); its strongest matches.
    row_box = page.locator(".st-key-dataset_qk_row input")
    row_box.fill("3")
    row_box.press("Enter")
    settle(page)
    first = expected_matches(root, lang, photo=0, row=3, col=2)
    page.get_by_text(first[0]).wait_for(timeout=60_000)
    text = page.locator("[data-testid='stMain']").inner_text()
    assert all(caption in text for caption in first), (first, text)
    _, paths = attnviz.qkmap.run_captures(root / "kept")
    query = i18n.text(lang, "qkmap.search_query", name=Path(paths[0]).name,
                      patch=i18n.text(lang, "analysis.patch", row=3, col=2))
    assert query in text, (query, text)

    # It fits: nothing wider than the screen, and the map's canvas inside it.
    width = page.evaluate("() => document.documentElement.scrollWidth")
    vw = SCREENS[where]["viewport"]["width"]
    assert width <= vw, (where, width)
    for chart in page.locator("[data-testid='stVegaLiteChart']").all():  # every head over the photos; this head's map
        box = chart.bounding_box()
        assert box is not None and box["width"] > 100 and box["x"] >= 0 and box["x"] + box["width"] <= vw + 0.5, box
    assert page.locator("[data-testid='stVegaLiteChart'] canvas").count() == 0  # the Q/K map is WebGL's now
    canvas = page.locator("canvas.qk-canvas")
    assert canvas.count() == 1
    box = canvas.bounding_box()
    assert abs(box["height"] - 460) <= 1 and box["x"] >= 0 and box["x"] + box["width"] <= vw + 0.5, box
    page.wait_for_function("() => Number(document.querySelector('canvas.qk-canvas').dataset.frames) >= 1")
    painted = canvas.evaluate("""async c => { const img = new Image(); img.src = c.toDataURL(); await img.decode();
        const k = document.createElement('canvas'); k.width = c.width; k.height = c.height;
        const g = k.getContext('2d'); g.drawImage(img, 0, 0);
        const d = g.getImageData(0, 0, k.width, k.height).data;
        let coloured = 0;  // saturated pixels: the viridis-coloured points
        for (let i = 0; i < d.length; i += 4)
          if (d[i+3] && Math.max(d[i], d[i+1], d[i+2]) - Math.min(d[i], d[i+1], d[i+2]) > 60) coloured++;
        return coloured; }""")
    assert painted > 500, painted  # 136 points drawn
    assert page.locator("[data-testid='stException']").count() == 0
    if SHOTS is not None:  # the section under the header, for a person to look at
        page.get_by_text(header).scroll_into_view_if_needed()
        shot(page, f"qkmap_dataset_{where}_{lang}")
    context.close()
