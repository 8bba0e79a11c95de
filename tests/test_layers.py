"""The layers import one way. Every package of farm stands on one ladder (RANKS) and
imports only packages of a lower rank, or itself; config modules import only config
modules; nothing below farm/actors imports Ray; no import cycle between farm's modules.
Lazy and type-checking imports count like any other."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

FARM = Path(__file__).resolve().parents[1] / "farm"

# The ladder, top down. A package is a folder or a module directly under farm/ ("farm"
# is the face, farm/__init__.py). A rank may name a package that is not built yet.
RANKS = {
    "__main__": 12, "farm": 12,
    "cli": 11, "commands": 11,
    "single": 10,  # farm.Rollouts: the entry point beside `farm run` and farm.Farm (both in run/)
    "run": 9,  # the run session: one invocation on one output directory
    "actors": 8,  # the only Ray code
    "rollout": 7, "report": 7, "integrations": 7,
    "envs": 5, "grading": 5,
    "workspace": 4, "harnesses": 4, "gateway": 4, "simulator": 4,
    "output": 3, "sandboxes": 3, "engine": 3,
    "trajectory": 2, "tasks": 2, "modeltext": 2, "loggers": 2, "config_reference": 2,
    "images": 2,  # container images: registry client, pull, unpack (their layers live in envs' store)
    "config": 1, "secrets": 1,  # with every CONFIG module (below)
    "errors": 0, "status": 0,
}
CONFIG_RANK = 1
RAY_FREE_BELOW = "actors"

# Upward edges that work in flight removes; each line goes with the commit that ends it.
# (importer, imported): a module, or a package and everything in it.
KNOWN_UPWARD: set[tuple[str, str]] = set()  # none left


def is_config(mod: str) -> bool:
    """The config layer: farm/config.py, farm/secrets.py, every farm/<package>/config.py
    (a command named config is a command) and the gateway's endpoint declarations."""
    parts = mod.split(".")
    return (mod in ("farm.config", "farm.secrets", "farm.gateway.endpoints")
            or (len(parts) == 3 and parts[2] == "config" and parts[1] != "commands"))


def package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "farm"


def modules() -> dict[str, Path]:
    mods = {}
    for path in FARM.rglob("*.py"):
        name = ".".join(path.relative_to(FARM.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def imported(tree: ast.AST, known: set[str]) -> tuple[set[str], set[str]]:
    """(the farm modules a file imports anywhere in it, the top-level names of the others)."""
    farm, other = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] != "farm":
                other.add(node.module.split(".")[0])
                continue
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            farm |= subs
            if len(subs) < len(node.names):  # names of the module itself, not submodules
                farm |= {node.module} & known
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "farm":
                    farm.add(a.name)
                else:
                    other.add(a.name.split(".")[0])
    return farm & known, other


@functools.cache
def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> farm modules it imports, module -> other top-level packages)."""
    mods = modules()
    edges, others = {}, {}
    for mod, path in mods.items():
        edges[mod], others[mod] = imported(ast.parse(path.read_text()), set(mods))
    return edges, others


def rank(mod: str, ranks: dict[str, int]) -> int | None:
    return CONFIG_RANK if is_config(mod) else ranks.get(package(mod))


def _within(mod: str, place: str) -> bool:
    return mod == place or mod.startswith(place + ".")


def ladder_violations(edges: dict[str, set[str]], ranks: dict[str, int], *,
                      known: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Every import that does not run down the ladder, in words."""
    found = []
    for mod in sorted(edges):
        if rank(mod, ranks) is None:
            found.append(f"{mod}: package {package(mod)!r} has no rank")
            continue
        for dep in sorted(edges[mod]):
            if any(_within(mod, a) and _within(dep, b) for a, b in known) or rank(dep, ranks) is None:
                continue  # an unranked dependency is reported as itself
            if is_config(mod):
                if not is_config(dep) and rank(dep, ranks) != 0:
                    found.append(f"{mod} -> {dep}: a config module imports only config modules")
            elif package(dep) != package(mod) or is_config(dep):
                if rank(dep, ranks) >= rank(mod, ranks):
                    found.append(f"{mod} (rank {rank(mod, ranks)}) -> {dep} (rank {rank(dep, ranks)}): runs up")
    return found


def ray_below_actors(others: dict[str, set[str]], ranks: dict[str, int]) -> list[str]:
    return sorted(m for m, names in others.items()
                  if "ray" in names and (rank(m, ranks) or 0) < ranks[RAY_FREE_BELOW])


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
        for w in edges.get(v, ()):
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


def test_every_import_runs_down_the_ladder():
    edges, _ = graph()
    assert ladder_violations(edges, RANKS, known=KNOWN_UPWARD) == []


def test_nothing_below_the_actors_imports_ray():
    _, others = graph()
    assert ray_below_actors(others, RANKS) == []


def test_no_import_cycles():
    edges, _ = graph()
    assert cycles(edges) == []


def test_rules_the_ladder_does_not_say():
    edges, _ = graph()

    def reaches(prefix: str, target: str) -> list[str]:
        return sorted(m for m, deps in edges.items() if m.startswith(prefix) and any(d.startswith(target) for d in deps))

    assert reaches("farm.sandboxes", "farm.tasks") == []  # a sandbox knows no task (both below the workspace)
    for live in ("farm.actors", "farm.run", "farm.gateway", "farm.engine",
                 "farm.sandboxes", "farm.simulator"):
        assert reaches("farm.report", live) == [], live  # a report reads the output directory, never the live farm


def test_the_checks_find_what_is_planted():
    ranks = {"farm": 4, "actors": 3, "tasks": 2, "engine": 2, "errors": 0}
    edges = {
        "farm.tasks.model": {"farm.actors.sandbox", "farm.errors", "farm.tasks.config"},  # up; down; own config
        "farm.engine.config": {"farm.engine.client", "farm.tasks.config", "farm.errors"},  # config -> not config
        "farm.engine.client": {"farm.tasks.model", "farm.engine.config"},  # same rank, another package
        "farm.actors.sandbox": {"farm.tasks.model", "farm.newpkg.x"},  # fine; an unranked dependency
        "farm.newpkg.x": set(),  # no rank
        "farm.tasks.config": set(), "farm.errors": set(), "farm.actors": set(),
    }
    assert ladder_violations(edges, ranks) == [
        "farm.engine.client (rank 2) -> farm.tasks.model (rank 2): runs up",
        "farm.engine.config -> farm.engine.client: a config module imports only config modules",
        "farm.newpkg.x: package 'newpkg' has no rank",
        "farm.tasks.model (rank 2) -> farm.actors.sandbox (rank 3): runs up",
    ]
    assert ladder_violations(edges, ranks,
                             known={("farm.tasks", "farm.actors.sandbox"),  # a package and all in it
                                    ("farm.engine.client", "farm.tasks.model"),
                                    ("farm.engine.config", "farm.engine.client")}) == [
        "farm.newpkg.x: package 'newpkg' has no rank"]
    assert ray_below_actors({"farm.actors.x": {"ray"}, "farm.tasks.y": {"ray", "yaml"}, "farm.engine.z": {"rayon"}},
                            ranks) == ["farm.tasks.y"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    farm, other = imported(ast.parse("from farm import a\nfrom farm.b import c, D\nimport ray.util\nimport farm.e"),
                           {"farm", "farm.a", "farm.b", "farm.b.c", "farm.e"})
    assert farm == {"farm.a", "farm.b", "farm.b.c", "farm.e"} and other == {"ray"}
