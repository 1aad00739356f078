"""The README's Library example runs as written (issue #13: its import line used to crash)."""
from __future__ import annotations

import re

from conftest import ROOT


def test_readme_library_example_runs(monkeypatch):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Library", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(code, "README.md (Library)", "exec"), scope)
    assert scope["cap"].num_tokens == 197 and scope["rollout"].rollout_map(scope["cap"]).shape == (14, 14)


def test_every_readme_python_example_runs(monkeypatch):
    """All ```python blocks, in order, as the before-stop check and a reader copying them run them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(ROOT)
    scopes = []
    for i, code in enumerate(blocks):
        scope: dict = {}
        exec(compile(code, f"README.md (python example {i + 1})", "exec"), scope)
        scopes.append(scope)
    live = next(s for s in scopes if "frame" in s)  # the live camera's per-frame example
    assert live["frame"].cls_map.shape == (14, 14) and live["frame"].picture.size == (196, 196)
