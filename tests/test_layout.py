"""The package's shape: no import cycles, no sys.path edits, the core free of Streamlit."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGES = ("attnviz", "attnviz_app")


def modules() -> dict[str, Path]:
    """Every module of the two packages, by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (function-level imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles():
    found = modules()
    graph = {name: imports(name, path, set(found)) for name, path in found.items()}
    assert graph["attnviz.cli"] >= {"attnviz.dataset_cli"}  # the graph sees imports (a check that can fail)
    assert "attnviz_app.live" in graph["attnviz_app.ui"]  # function-level imports count too
    assert cycle(graph) is None, " → ".join(cycle(graph))


def test_the_cycle_finder_finds_cycles():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_sys_path_edits_in_the_project():
    code = [*ROOT.glob("*.py"), *(ROOT / "attnviz").rglob("*.py"), *(ROOT / "attnviz_app").rglob("*.py"),
            *(ROOT / "bench").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    edit = re.compile(r"sys\.path\.(insert|append|extend)\(|sys\.path\[[^\]]*\]\s*=|sys\.path\s*[+]?=|"
                      r"[\"']PYTHONPATH[\"']\s*[:\]]|PYTHONPATH=")
    assert edit.search('sys.path.insert(0, str(ROOT))') and edit.search('env={"PYTHONPATH": root}')  # it can fail
    offenders = [str(p.relative_to(ROOT)) for p in code if p != Path(__file__) and edit.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_core_never_imports_streamlit():
    found = modules()
    for name, path in found.items():
        if name.split(".")[0] != "attnviz":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] in ("streamlit", "streamlit_webrtc") for n in names), name
