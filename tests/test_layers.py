"""The layers import one way: no import cycle between farm's modules (lazy and
type-checking imports included), and the rules DESIGN.md states hold."""

from __future__ import annotations

import ast
from pathlib import Path

FARM = Path(__file__).resolve().parents[1] / "farm"


def imports() -> dict[str, set[str]]:
    """module -> the farm modules it imports anywhere in its file."""
    mods = {}
    for path in FARM.rglob("*.py"):
        name = ".".join(path.relative_to(FARM.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("farm"):
                found = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
                edges[mod] |= found & mods.keys()
            elif isinstance(node, ast.Import):
                edges[mod] |= {a.name for a in node.names} & mods.keys()
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(imports()) == []


def test_the_detector_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def _imports_ray(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ray" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ray":
            return True
    return False


def test_layer_rules():
    edges = imports()

    def reaches(prefix: str, target: str) -> list[str]:
        return sorted(m for m, deps in edges.items() if m.startswith(prefix) and any(d.startswith(target) for d in deps))

    assert reaches("farm.engine", "farm.gateway") == []  # tool-call formats and the client config live below
    assert reaches("farm.tasks", "farm.sandboxes") == []  # tasks are data
    assert reaches("farm.tasks", "farm.workspace") == []
    assert reaches("farm.model", "farm.engine") == [] and reaches("farm.model", "farm.gateway") == []
    assert reaches("farm.sandboxes", "farm.tasks") == [] and reaches("farm.sandboxes", "farm.envs") == []
    for live in ("farm.actors", "farm.driver", "farm.continuous", "farm.gateway", "farm.engine", "farm.sandboxes"):
        assert reaches("farm.report", live) == [], live  # a report reads the output directory, never the live farm
    # continuous and single sit beside the driver
    above = ("actors", "driver.py", "continuous.py", "single", "commands", "cli.py", "__main__.py")
    below = [p for p in FARM.rglob("*.py") if p.relative_to(FARM).parts[0] not in above]
    assert [str(p) for p in below if _imports_ray(p)] == []  # nothing below farm/actors imports Ray
