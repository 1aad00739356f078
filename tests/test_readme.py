"""The documentation keeps its promises: README.md and every docs/*.md.

Every ```python block runs as written, in order, from an empty temporary folder (so an example cannot
lean on files of the checkout: photos come from ``attnviz.photos.sample``). The blocks of one file share
one namespace, as cells of one notebook do. The README stays a front door (at most 250 lines), and
every relative link in it and in docs/ points to a file, and to a heading, that exists.
(Issue #13: the README's import line used to crash; issue #19: the README split into docs/.)
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 250

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def blocks(page: Path) -> list[str]:
    return PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))


def run_blocks(page: Path, where: Path, monkeypatch) -> dict:
    """Run ``page``'s python blocks in order, in one namespace, from the folder ``where``."""
    from attnviz.adapters import registry
    from attnviz_app.views import base  # a docs example may register a view or a family: keep them out of the app's

    import attnviz.adapters
    import attnviz_app.views

    attnviz.adapters.families(), attnviz_app.views.registered()  # the built-in ones register into the real registries
    monkeypatch.setattr(base, "_REGISTERED", dict(base._REGISTERED))
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))
    monkeypatch.chdir(where)
    scope: dict = {"__name__": f"docs_{page.stem}"}
    for i, code in enumerate(blocks(page)):
        exec(compile(code, f"{page.relative_to(ROOT)} (python example {i + 1})", "exec"), scope)
    return scope


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def readme_library(scope: dict, folder: Path) -> None:
    assert scope["cap"].num_tokens == 197 and scope["cls"].shape == (14, 14)
    assert (folder / "cat_attention.png").is_file()


def library(scope: dict, folder: Path) -> None:
    cap = scope["cap"]
    assert cap.num_tokens == 197 and scope["rollout"].rollout_map(cap).shape == (14, 14)
    assert scope["back"].weights(11, 0).shape == (197, 197)
    assert (folder / "cat.html").stat().st_size > 0 and (folder / "cat_layers.gif").stat().st_size > 0


def live_camera(scope: dict, folder: Path) -> None:
    assert scope["frame"].cls_map.shape == (14, 14) and scope["frame"].picture.size == (196, 196)


def worked_view(scope: dict, folder: Path) -> None:
    from attnviz_app.views import base

    view = base.registered()["spread"]  # registered on the test's copy of the registry
    assert callable(view.show) and base.LAYER in view.controls and base.HEAD not in view.controls


def datasets(scope: dict, folder: Path) -> None:
    assert scope["tables"].heads.num_rows == 4 * 12 * 6 and scope["summary"].errors == 0


# Beyond running, what some examples must give (what their comments promise).
CHECKS = {
    "README.md": readme_library,
    "docs/library.md": library,
    "docs/live-camera.md": live_camera,
    "docs/architecture.md": worked_view,
    "docs/datasets.md": datasets,
}


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=name)
def test_every_python_example_runs_from_an_empty_folder(page, tmp_path, monkeypatch):
    scope = run_blocks(page, tmp_path, monkeypatch)
    if name(page) in CHECKS:
        CHECKS[name(page)](scope, tmp_path)


def test_the_checked_examples_are_there():
    assert "```python" in README.read_text(encoding="utf-8").split("## Library", 1)[1].split("\n## ", 1)[0]
    assert all((ROOT / page).is_file() and blocks(ROOT / page) for page in CHECKS)


def test_the_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"
    assert len(blocks(README)) >= 1
    assert "make run" in README.read_text(encoding="utf-8") and "make test" in README.read_text(encoding="utf-8")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text(encoding="utf-8")))  # no code
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # not http:, mailto:, …


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_relative_links_point_to_files_and_headings_that_exist(page):
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(target)
    assert broken == [], f"{name(page)}: broken links {broken}"


def test_the_readme_links_to_every_docs_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(README) if t.startswith("docs/")}
    assert linked >= {p.resolve() for p in DOCS}, sorted(p.name for p in set(DOCS) - linked)
    assert (ROOT / "docs" / "screenshot.png").resolve() in linked


def test_the_link_checker_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title\n[ok](#a-title) [gone](missing.md) [bad anchor](#nowhere) [web](https://x.org)\n")
    assert relative_links(page) == ["#a-title", "missing.md", "#nowhere"]
    assert anchors(page) == {"a-title"}
    assert slug("Which attention attnviz reads, and how exactness was checked") == \
        "which-attention-attnviz-reads-and-how-exactness-was-checked"
