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
