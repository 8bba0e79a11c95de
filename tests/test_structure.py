"""What farm's tree holds and what it must not hold again.

- No deprecation mechanisms: a 0.x package renames freely and says so in CHANGELOG.md, so
  farm warns no DeprecationWarning, keeps no meta-path finder (``farm/moved.py`` was one),
  no module ``__getattr__`` serving old names (only the face, ``farm/__init__.py``, imports
  lazily that way) and no alias of a class or function under a second name.
- No comment points at an issue number: a comment says the reason itself.
- No test helper in the package: nothing in farm imports from tests/, farm has no testing
  package, every module of farm is used by farm, an example, a script or the docs (a module
  only tests use belongs in tests/testkit), and the wheel holds farm's modules and no others.
- Interfaces say what callers use: no module reads a member of the ``Sandbox`` protocol with
  ``getattr`` (as if a sandbox might lack it); a backend that lacks one fails ``isinstance``.
- One owner per decision: a rollout's status is named (recorded, returned, passed on) only by
  ``farm/rollout/outcome.py`` (and declared in ``farm/status.py``); elsewhere a status is
  only compared with, and no module but those builds an ``Outcome``.
- Tests wait on conditions, not times: a ``sleep`` in tests/ with no comment on its line or
  the line above (saying what the time is for: the slow agent, the window in which nothing may
  happen, the clock to pass, a poll bounded by its loop's deadline) is a bare sleep, and there
  is none (``BARE_SLEEPS_MAX`` is 0).
  A wait for something is ``testkit.waits.wait_until`` / ``async_wait_until``.
- An import inside a function in farm/ says why it is not at the top of its module: a comment
  on its line or above its run of imports (``# heavy: pyarrow``, ``# optional extra: torch``,
  the CLI's start-up, a choice only some configs make). None lacks one
  (``BARE_INLINE_IMPORTS_MAX`` is 0).

Each check takes a root, so ``test_the_checks_find_what_is_planted`` runs it on a made-up
tree holding each violation."""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACE = "farm/__init__.py"  # farm.Farm / farm.Rollouts imported on first use (Ray only when asked for)
WARNINGS_OF_RENAMES = ("DeprecationWarning", "PendingDeprecationWarning", "FutureWarning")
# an issue or pull request named by its number: the word (issue, issues, PR) or "see" before it, or
# a number sign in parentheses
ISSUE_REF = re.compile(r"\b[Ii]ssues? ?#?\d+\b|\(#\d+\)|\bPR ?#?\d+\b|\bsee #\d+\b")
COMMENTED = ("farm", "tests", "scripts", "examples")  # where code and its comments live
NOT_COMMENTS = ("tests/fixtures",)  # captured wire data, quoted as recorded


def _py_files(root: Path, top: str = "farm") -> list[Path]:
    return sorted(p for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts)


def _module(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _prefixes(dotted: str) -> set[str]:
    parts = dotted.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def deprecation_mechanisms(root: Path) -> list[str]:
    """Every warning of a rename, module ``__getattr__`` (but the face's), meta-path finder
    and alias in farm/."""
    found = []
    if (root / "farm" / "moved.py").exists():
        found.append("farm/moved.py: old module paths served by a finder")
    for path in _py_files(root):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and rel != FACE:
                found.append(f"{rel}:{node.lineno}: module __getattr__ (names served from elsewhere)")
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Name) and node.value.id in defined):
                found.append(f"{rel}:{node.lineno}: {node.targets[0].id} is an alias of {node.value.id}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("warn"):
                if any(w in ast.unparse(node) for w in WARNINGS_OF_RENAMES):
                    found.append(f"{rel}:{node.lineno}: warns of a rename ({ast.unparse(node)[:80]})")
            if isinstance(node, ast.Attribute) and node.attr == "meta_path":
                found.append(f"{rel}:{node.lineno}: an import finder (sys.meta_path)")
    return found


def issue_references(root: Path) -> list[str]:
    """Every line of code, comment or docstring under COMMENTED that names an issue by number."""
    found = []
    for top in COMMENTED:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.suffix not in (".py", ".sh") or rel.startswith(NOT_COMMENTS) or "__pycache__" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if ISSUE_REF.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    return found


def helpers_of_tests(root: Path) -> set[str]:
    """The top-level names tests/ puts on the path: its packages and modules (``testkit``,
    ``farm_helpers``, ``gateway_helpers``, ...), and ``tests`` itself."""
    names = {"tests"}
    for path in (root / "tests").rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root / "tests")
        if len(rel.parts) > 1 and (root / "tests" / rel.parts[0] / "__init__.py").exists():
            names.add(rel.parts[0])  # a package on the tests' path (testkit)
        else:
            names.add(path.stem)  # a module found by name (its directory is on the path)
    return names - {"__init__", "farm"}  # tests/farm holds helpers, but "farm" is the package itself


def helpers_in_the_package(root: Path) -> list[str]:
    """A testing package in farm/, or a farm module importing from tests/."""
    found = []
    for name in ("testing", "testkit", "tests"):
        if (root / "farm" / name).exists():
            found.append(f"farm/{name}/: a test kit inside the package")
    helpers = helpers_of_tests(root)
    for path in _py_files(root):
        rel = path.relative_to(root).as_posix()
        if path.name == "conftest.py" or path.name.startswith("test_"):
            found.append(f"{rel}: a test module inside the package")
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{rel}:{node.lineno}: imports {n} (a test helper)" for n in names
                      if n.split(".")[0] in helpers or n.startswith("farm.testing")]
    return found


def modules_only_tests_use(root: Path) -> list[str]:
    """farm modules nothing but tests reaches: not imported (or named in a string, as the
    CLI names its commands) by another farm module, an example or a script, nor named in the
    docs. Package ``__init__`` modules and ``__main__`` are reached by being packages."""
    mods = {_module(root, p): p for p in _py_files(root)}
    used: set[str] = set()

    def reached(tree: ast.AST, here: str) -> set[str]:
        out: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out |= _prefixes(node.module) | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                out |= set().union(*(_prefixes(a.name) for a in node.names))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                out |= set().union(set(), *(_prefixes(d) for d in re.findall(r"\bfarm(?:\.\w+)+", node.value)))
                # a sibling read by its file name (the grading probe's plugin source)
                out |= {f"{here.rsplit('.', 1)[0]}.{f}" for f in re.findall(r"\b(\w+)\.py\b", node.value)}
        return out

    for mod, path in mods.items():
        used |= reached(ast.parse(path.read_text()), mod) - {mod}
    for top in ("examples", "scripts"):
        for path in sorted((root / top).glob("*.py")):
            used |= reached(ast.parse(path.read_text()), f"{top}.{path.stem}")
    for page in sorted((root / "docs").rglob("*.md")):
        used |= set().union(set(), *(_prefixes(d) for d in re.findall(r"\bfarm(?:\.\w+)+", page.read_text())))
    return sorted(f"{path.relative_to(root).as_posix()}: only tests use {mod}" for mod, path in mods.items()
                  if mod not in used and path.name not in ("__init__.py", "__main__.py"))


STATUS_OWNERS = ("farm/status.py", "farm/rollout/outcome.py")  # the vocabulary, and what decides it
# statuses named elsewhere, each for its reason: (module, member)
STATUS_READS = {
    ("farm/actors/dashboard.py", "TRUNCATED"),  # a Prometheus selector on the status label, not a decision
    # a rollouts row rebuilt after a reducer crash from no Sample at all: nothing recorded how it ended,
    # and the output layer (below the rollout's) keeps it out of training as an infrastructure failure
    ("farm/output/rows.py", "SANDBOX_ERROR"),
}


def _status_names(tree: ast.AST) -> set[str]:
    """The names ``RolloutStatus`` goes by in a module (its own, an ``as`` import, ``S = RolloutStatus``)."""
    names = {"RolloutStatus"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname for a in node.names if a.name == "RolloutStatus" and a.asname}
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in names:
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def statuses_decided_outside_outcome(root: Path) -> list[str]:
    """Every place outside ``STATUS_OWNERS`` that names a RolloutStatus member other than to
    compare with it (``is``, ``==``, ``in (...)``, its ``.value`` likewise), or builds an ``Outcome``."""
    found = []
    for path in _py_files(root):
        rel = path.relative_to(root).as_posix()
        if rel in STATUS_OWNERS:
            continue
        tree = ast.parse(path.read_text())
        parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        names = _status_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "Outcome"
                                               or getattr(node.func, "attr", None) == "Outcome"):  # fmt: skip
                found.append(f"{rel}:{node.lineno}: builds an Outcome")
                continue
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in names:
                found.append(f"{rel}:{node.lineno}: looks a status up by name")
                continue
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names
                    and node.attr.isupper()):  # fmt: skip
                continue
            member, up = node.attr, parent.get(node)
            if isinstance(up, ast.Attribute) and up.attr == "value":
                up = parent.get(up)
            while isinstance(up, (ast.Tuple, ast.List, ast.Set)):
                up = parent.get(up)
            if not isinstance(up, ast.Compare) and (rel, member) not in STATUS_READS:
                found.append(f"{rel}:{node.lineno}: names RolloutStatus.{member} (ask farm.rollout.outcome)")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1]), f))


RETRY_OWNER = "farm/actors/reducer.py"  # asks the retry decision for every attempt's end
RETRY_POLICY = ("farm/rollout/retry.py", "farm/status.py")  # the decision itself, and its data
RETRY_ASKS = ("decide", "RetryBudgets")  # asking the decision, or holding the budgets it spends


def retry_decided_outside_the_reducer(root: Path) -> list[str]:
    """Every place outside ``RETRY_OWNER`` (and the policy that declares it) that asks the
    retry decision (``farm.rollout.retry.decide``, by any name), holds its budgets, or makes a
    ``RetryDecision`` of its own."""
    found = []
    for path in _py_files(root):
        rel = path.relative_to(root).as_posix()
        if rel in (RETRY_OWNER, *RETRY_POLICY):
            continue
        tree = ast.parse(path.read_text())
        modules = set()  # the names farm.rollout.retry goes by here
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "farm.rollout.retry":
                found += [f"{rel}:{node.lineno}: imports {a.name} from farm.rollout.retry (the reducer decides)"
                          for a in node.names if a.name in RETRY_ASKS]  # fmt: skip
            elif isinstance(node, ast.ImportFrom) and node.module == "farm.rollout":
                modules |= {a.asname or a.name for a in node.names if a.name == "retry"}
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name for a in node.names if a.name == "farm.rollout.retry"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in RETRY_ASKS and ast.unparse(node.value) in modules:
                found.append(f"{rel}:{node.lineno}: uses {ast.unparse(node)} (the reducer decides)")
            elif isinstance(node, ast.Call) and "RetryDecision" in (getattr(node.func, "id", None),
                                                                    getattr(node.func, "attr", None)):  # fmt: skip
                found.append(f"{rel}:{node.lineno}: makes a RetryDecision (the reducer decides)")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1]), f))


def _protocol_members(path: Path, name: str) -> set[str]:
    """The members a Protocol class in ``path`` declares (annotated attributes, methods, properties)."""
    (cls,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name]
    return ({n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            | {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})  # fmt: skip


def sandbox_members_read_by_getattr(root: Path) -> list[str]:
    """Every ``getattr(<a sandbox>, "<a Sandbox protocol member>", ...)`` in farm/: the protocol
    declares it, so every sandbox has it."""
    members = _protocol_members(root / "farm/sandboxes/base.py", "Sandbox")
    found = []
    for path in _py_files(root):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in members
                    and re.search(r"(?i)sandbox|\bsb\b", ast.unparse(node.args[0]))):  # fmt: skip
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)} (the Sandbox protocol declares it)")
    return found


# a sleep polled by the wait helpers themselves; and the most bare sleeps tests/ may hold: none
# (a poll in a loop with a deadline says so, as does a sleep that is the behaviour)
SLEEP_HELPERS = ("tests/testkit/waits.py",)
BARE_SLEEPS_MAX = 0


def _comment_lines(text: str) -> set[int]:
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.COMMENT}  # fmt: skip


def bare_sleeps(root: Path) -> list[str]:
    """Every ``sleep(<not 0>)`` call in tests/ (``time.sleep``, ``asyncio.sleep``, ``sleep``)
    without a comment on its line or the line above. ``sleep(0)`` (a yield to the loop) and
    sleeps inside a string (a script a test runs: its behaviour) are not calls here."""
    found = []
    for path in _py_files(root, "tests"):
        rel = path.relative_to(root).as_posix()
        if rel in SLEEP_HELPERS:
            continue
        text = path.read_text()
        comments = _comment_lines(text)
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and (getattr(node.func, "attr", None) == "sleep"
                                                    or getattr(node.func, "id", None) == "sleep")):  # fmt: skip
                continue
            if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0:
                continue
            if not {node.lineno, node.lineno - 1} & comments:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


# the packages another change owns keep their uncommented inline imports until then: only ever lowered
BARE_INLINE_IMPORTS_MAX = 0


def bare_inline_imports(root: Path) -> list[str]:
    """Every import inside a function in farm/ with no comment on its line or on the line
    above the run of consecutive imports it belongs to."""
    found = []
    for path in _py_files(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        comments = _comment_lines(text)
        tree = ast.parse(text)
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for block in ast.walk(func):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    stmts = getattr(block, field, None)
                    if not isinstance(stmts, list):
                        continue
                    run_start = None
                    for stmt in stmts:
                        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                            run_start = None
                            continue
                        run_start = stmt.lineno if run_start is None else run_start
                        if not set(range(run_start - 1, stmt.end_lineno + 1)) & comments:
                            found.append(f"{rel}:{stmt.lineno}: {ast.unparse(stmt)}")
    return sorted(set(found), key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


# --- the tree ----------------------------------------------------------------------------
def test_no_deprecation_mechanisms():
    assert deprecation_mechanisms(ROOT) == []


def test_no_comment_names_an_issue_number():
    assert issue_references(ROOT) == [], "say the reason in the comment, not the issue it came from"


def test_no_test_helper_in_the_package():
    assert helpers_in_the_package(ROOT) == []
    assert modules_only_tests_use(ROOT) == [], "a module only tests use belongs in tests/testkit"


def test_tests_wait_on_conditions_not_times():
    found = bare_sleeps(ROOT)
    assert len(found) <= BARE_SLEEPS_MAX, (
        "a sleep that waits for something: testkit.waits.wait_until; a sleep that is the behaviour "
        "under test: say so in a comment\n" + "\n".join(found))


def test_the_sleep_check_finds_what_is_planted(tmp_path):
    (tmp_path / "tests" / "testkit").mkdir(parents=True)
    (tmp_path / "tests" / "testkit" / "waits.py").write_text("import time\ntime.sleep(0.05)\n")
    (tmp_path / "tests" / "test_x.py").write_text(
        "import asyncio, time\nfrom time import sleep\n"
        "time.sleep(0.5)\n"  # bare
        "time.sleep(3)  # the clock passes the deadline\n"
        "# a slow agent\nawait asyncio.sleep(1)\n"
        "await asyncio.sleep(0)\n"
        "sleep(2)\n"  # bare
        "x = 'time.sleep(9)'\n")
    assert bare_sleeps(tmp_path) == ["tests/test_x.py:3: time.sleep(0.5)", "tests/test_x.py:8: sleep(2)"]


def test_an_inline_import_says_why():
    found = bare_inline_imports(ROOT)
    assert len(found) <= BARE_INLINE_IMPORTS_MAX, (
        "import it at the top of the module, or say why not (# heavy: x, # optional extra: x, # cycle: ...)\n"
        + "\n".join(found))


def test_the_inline_import_check_finds_what_is_planted(tmp_path):
    (tmp_path / "farm").mkdir()
    (tmp_path / "farm" / "m.py").write_text(
        "import os\n"
        "def f():\n    import json\n    return json\n"  # bare
        "def g():\n    # heavy: pyarrow\n    import pyarrow\n    from pyarrow import parquet\n    x = 1\n"
        "    import yaml\n"  # bare: a new run, no comment
        "def h():\n    import torch  # optional extra\n"
        "    if True:\n        from farm import x\n")  # bare, in a nested block
    assert bare_inline_imports(tmp_path) == ["farm/m.py:3: import json", "farm/m.py:10: import yaml",
                                             "farm/m.py:14: from farm import x"]


def test_only_outcome_decides_a_status():
    assert statuses_decided_outside_outcome(ROOT) == [], "report what happened; farm.rollout.outcome names the status"


def test_only_the_reducer_decides_a_retry():
    assert retry_decided_outside_the_reducer(ROOT) == [], "report how the attempt ended; the reducer decides"


def test_the_retry_check_finds_what_is_planted(tmp_path):
    """Asking ``decide`` (by any import), holding the budgets or making a decision by hand is
    found outside the reducer; the reducer, the policy itself, a rerun count and the grader's
    own ``decide`` (a hack finding's) are not."""
    files = {
        "farm/rollout/retry.py": "def decide(): ...\nclass RetryBudgets: ...\n",
        "farm/actors/reducer.py": "from farm.rollout.retry import RetryBudgets, decide\nd = decide()\n",
        "farm/actors/sandbox.py": "from farm.rollout.retry import decide as ask\n",
        "farm/actors/dispatch.py": "import farm.rollout.retry as r\nfrom farm.rollout import retry\nimport farm.rollout.retry\n"
                                   "a = r.decide(), retry.RetryBudgets(1), farm.rollout.retry.decide()\n",
        "farm/single/handle.py": "from farm.status import RetryDecision, Verdict\nd = RetryDecision(Verdict.RECORD)\n",
        "farm/rollout/model.py": "from farm.rollout.retry import Reruns\n",
        "farm/grading/grader.py": "from farm.grading.hacks import decide\nx = decide([])\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert retry_decided_outside_the_reducer(tmp_path) == [
        "farm/actors/dispatch.py:4: uses farm.rollout.retry.decide (the reducer decides)",
        "farm/actors/dispatch.py:4: uses r.decide (the reducer decides)",
        "farm/actors/dispatch.py:4: uses retry.RetryBudgets (the reducer decides)",
        "farm/actors/sandbox.py:1: imports decide from farm.rollout.retry (the reducer decides)",
        "farm/single/handle.py:2: makes a RetryDecision (the reducer decides)",
    ]


def test_callers_use_the_sandbox_protocol_as_declared(tmp_path):
    assert sandbox_members_read_by_getattr(ROOT) == []
    planted = {
        "farm/sandboxes/base.py": "class Sandbox:\n    id: str\n    def busy_processes(self): ...\n",
        "farm/rollout/use.py": "def f(sandbox, sb, st, other):\n"
                               "    return (getattr(sandbox, 'busy_processes', None), getattr(st.sandbox, 'id', ''),\n"
                               "            getattr(sb, 'closed', False), getattr(other, 'id', ''))\n",
    }
    for rel, text in planted.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert sandbox_members_read_by_getattr(tmp_path) == [
        "farm/rollout/use.py:2: getattr(sandbox, 'busy_processes', None) (the Sandbox protocol declares it)",
        "farm/rollout/use.py:2: getattr(st.sandbox, 'id', '') (the Sandbox protocol declares it)",
    ]


def test_the_status_check_finds_what_is_planted(tmp_path):
    """Naming a status to record it, return it or pass it on is found outside the owners;
    comparing with one (also through an alias or its ``.value``) is not."""
    files = {
        "farm/status.py": "class RolloutStatus: ...\nclass Outcome: ...\nPOLICY = {RolloutStatus.COMPLETED}\n",
        "farm/rollout/outcome.py": "from farm.status import RolloutStatus, Outcome\n"
                                   "def f():\n    return Outcome(status=RolloutStatus.STALE)\n",
        "farm/actors/dashboard.py": "from farm.status import RolloutStatus\nq = sel(status=RolloutStatus.TRUNCATED.value)\n",
        "farm/actors/reads.py": "from farm.status import RolloutStatus as S\n"
                                "def f(r):\n    return r.status is S.STALE or r.status in (S.TIMEOUT, S.COMPLETED) "
                                "or r.s == S.TRUNCATED.value or r.s not in {S.ABORTED.value}\n",
        "farm/actors/decides.py": "from farm.status import Outcome, RolloutStatus\nimport farm.status as st\n"
                                  "S = RolloutStatus\n"
                                  "def f(r):\n    r.status = RolloutStatus.STALE\n    return S.TIMEOUT, 'why'\n"
                                  "def g(r):\n    return Outcome(status=r), st.Outcome(status=r), S['ABORTED']\n"
                                  "DEFAULT = RolloutStatus.SANDBOX_ERROR.value\n"
                                  "q = sel(status=S.TRUNCATED.value)\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert statuses_decided_outside_outcome(tmp_path) == [
        "farm/actors/decides.py:5: names RolloutStatus.STALE (ask farm.rollout.outcome)",
        "farm/actors/decides.py:6: names RolloutStatus.TIMEOUT (ask farm.rollout.outcome)",
        "farm/actors/decides.py:8: builds an Outcome",
        "farm/actors/decides.py:8: builds an Outcome",
        "farm/actors/decides.py:8: looks a status up by name",
        "farm/actors/decides.py:9: names RolloutStatus.SANDBOX_ERROR (ask farm.rollout.outcome)",
        "farm/actors/decides.py:10: names RolloutStatus.TRUNCATED (ask farm.rollout.outcome)",
    ]


def test_the_checks_find_what_is_planted(tmp_path):
    """Every check on a made-up tree holding one violation of each kind (and the legitimate
    look-alikes, which pass). The planted references are spelled in two halves, or this file
    would name issue numbers itself."""
    root, issue = tmp_path, "iss" + "ue"
    files = {
        "farm/__init__.py": "def __getattr__(name):\n    from farm import run\n    return run\n",  # the face: allowed
        "farm/moved.py": "import sys\nsys.meta_path.append(object())\n",
        "farm/run.py": "import warnings\nfrom testkit.hosted import HostedFake\nclass Runner: ...\n"
                       "OldRunner = Runner\nwarnings.warn('moved', DeprecationWarning)\nDEFAULT = 3\nLIMIT = DEFAULT\n",
        "farm/old.py": "import importlib\ndef __getattr__(name):\n    return importlib.import_module('farm.run')\n",
        "farm/used.py": "import farm.run\nimport farm.old\nx = 'farm.moved'\nLOADED = 'plugin.py'\n",
        "farm/plugin.py": "", "farm/lonely.py": "",
        "farm/testing/__init__.py": "", "farm/testing/test_kit.py": "",
        "tests/testkit/__init__.py": "", "tests/testkit/hosted.py": "class HostedFake: ...\n",
        "tests/gateway/gateway_helpers.py": "", "tests/fixtures/capture.py": f"# logs/claude.jsonl #3, {issue} 7\n",
        "scripts/bench.py": f"# see {issue} 27 for the reason\nimport farm.used\n",
        "examples/loop.py": "x = 1  # fixed in (" + "#31)\n",
        "docs/page.md": "`farm.testing.test_kit` is documented\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert deprecation_mechanisms(root) == [
        "farm/moved.py: old module paths served by a finder",
        "farm/moved.py:2: an import finder (sys.meta_path)",
        "farm/old.py:2: module __getattr__ (names served from elsewhere)",
        "farm/run.py:4: OldRunner is an alias of Runner",
        "farm/run.py:5: warns of a rename (warnings.warn('moved', DeprecationWarning))",
    ]
    assert issue_references(root) == [f"scripts/bench.py:1: # see {issue} 27 for the reason",
                                      "examples/loop.py:1: x = 1  # fixed in (" + "#31)"]
    assert helpers_of_tests(root) == {"tests", "testkit", "gateway_helpers", "capture"}
    assert helpers_in_the_package(root) == [
        "farm/testing/: a test kit inside the package",
        "farm/run.py:2: imports testkit.hosted (a test helper)",
        "farm/testing/test_kit.py: a test module inside the package",
    ]
    assert modules_only_tests_use(root) == ["farm/lonely.py: only tests use farm.lonely"]


# --- the wheel ---------------------------------------------------------------------------
def test_the_wheel_holds_farm_and_nothing_else(tmp_path):
    """A wheel built the way a release is (setuptools, from pyproject.toml, in a clean copy:
    an in-tree build/ keeps stale files) holds exactly farm's modules and package data."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "farm", src / "farm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path / "dist"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=240)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = out.glob("farm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = sorted(n for n in names if n.endswith(".py"))
    assert modules == sorted(p.relative_to(ROOT).as_posix() for p in _py_files(ROOT))
    assert all(n.startswith(("farm/", "farm-")) for n in names), [n for n in names if not n.startswith("farm")]
    assert not [n for n in names if "/testing/" in n or "/testkit/" in n or n.rsplit("/", 1)[-1] == "conftest.py"]
