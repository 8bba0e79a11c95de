"""Black-box is a mode and a session kind, not a flag. Production code asks the run's
``RolloutMode`` (``cfg.mode.needs_engine`` / ``writes_samples`` / ``endpoint_fails_sessions``)
and a gateway session its ``record`` / ``failure``; it never reads ``cfg.black_box`` (a
convenience for users' scripts), never compares a mode's string, never tests whether a
session has a transcript, and never sniffs a record's or a session's class to learn the mode,
except where a record becomes its output form (ALLOWED_ISINSTANCE)."""

from __future__ import annotations

import ast
from pathlib import Path

FARM = Path(__file__).resolve().parents[1] / "farm"

MODE_STRINGS = {"black_box", "token_exact"}
# classes whose isinstance tells the mode: the records, the session kinds, the endpoint kinds
MODE_CLASSES = {"Transcript", "TurnTree", "TokenSession", "HostedSession", "FarmEndpoint", "HostedEndpoint"}
# Where a session's record is turned into its output form by its own type (the turns.jsonl
# lines, the rollouts row's counts, a session's canonical messages): the type is the data's,
# asked where the data is read, not a mode decision.
ALLOWED_ISINSTANCE = {
    "farm.trajectory.transcript": {"Transcript"},  # main_line_messages
    "farm.output.artifacts": {"Transcript"},  # turns_jsonl
    "farm.output.rows": {"Transcript"},  # counts_of
}


def _names(node: ast.expr) -> set[str]:
    """The class names an isinstance's second argument names (a name, an attribute, a tuple)."""
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def mode_flags(source: str, module: str) -> list[str]:
    """Every place ``source`` (the module ``module``) treats black-box as a flag, in words."""
    found = []
    allowed = ALLOWED_ISINSTANCE.get(module, set())
    for node in ast.walk(ast.parse(source)):
        where = f"{module}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and node.attr == "black_box":
            found.append(f"{where}: reads .black_box (ask cfg.mode)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args
            if node.func.id in ("getattr", "hasattr") and len(args) >= 2 and isinstance(args[1], ast.Constant) \
                    and args[1].value in ("black_box", "transcript"):
                found.append(f"{where}: {node.func.id}(..., {args[1].value!r})")
            if node.func.id == "isinstance" and len(args) == 2:
                sniffed = (_names(args[1]) & MODE_CLASSES) - allowed
                if sniffed:
                    found.append(f"{where}: isinstance(..., {', '.join(sorted(sniffed))}) (ask the mode / the record)")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            strings = {s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)}
            if strings & MODE_STRINGS:
                found.append(f"{where}: compares with {sorted(strings & MODE_STRINGS)} (compare RolloutMode members)")
            if any(isinstance(s, ast.Attribute) and s.attr == "transcript" for s in sides) \
                    and any(isinstance(s, ast.Constant) and s.value is None for s in sides):
                found.append(f"{where}: tests transcript against None (a session's kind is its type)")
    return found


def test_production_code_asks_the_mode_not_a_flag():
    found = []
    for path in sorted(FARM.rglob("*.py")):
        module = ".".join(path.relative_to(FARM.parent).with_suffix("").parts).removesuffix(".__init__")
        found += mode_flags(path.read_text(), module)
    assert found == []


def test_the_check_finds_what_is_planted():
    planted = "\n".join([
        "if cfg.black_box: pass",  # 1: the flag
        "x = getattr(cfg, 'black_box', False)",  # 2
        "if result.mode == 'black_box': pass",  # 3: a mode's string
        "if 'token_exact' != mode: pass",  # 4
        "if session.transcript is not None: pass",  # 5: optional transcript beside the tree
        "if isinstance(result.tree, Transcript): pass",  # 6: sniffing the record
        "if isinstance(ep, (OpenAIEndpoint, endpoints.FarmEndpoint)): pass",  # 7
        "if isinstance(s, HostedSession): pass",  # 8
        # what is fine: asking the mode, comparing members, other attributes and classes
        "if cfg.mode.needs_engine and result.mode is RolloutMode.BLACK_BOX: pass",
        "if isinstance(ep, AnthropicEndpoint) and session.failure is None: pass",
        "def f(black_box=None): return black_box is not None",
    ])
    assert [f.split(":")[1] for f in mode_flags(planted, "farm.x")] == [str(n) for n in range(1, 9)]
    assert mode_flags("isinstance(t, Transcript)", "farm.output.rows") == []  # allowed there
    assert mode_flags("isinstance(t, (TurnTree, Transcript))", "farm.output.rows") == [
        "farm.output.rows:1: isinstance(..., TurnTree) (ask the mode / the record)"]
