"""SWE-bench's PASS_TO_PASS rule, graded for real: a P2P test may be skipped; a F2P one may not."""

from __future__ import annotations

import shlex

from farm.grading import grade, grading_spec
from farm.tasks.model import Task

TESTS = (
    "import pytest\n"
    "def test_fixed():\n    from mod import f\n    assert f() == 1\n"
    "@pytest.mark.skip(reason='platform')\ndef test_skipped():\n    pass\n"
)
GOLD = "diff --git a/mod.py b/mod.py\nnew file mode 100644\n--- /dev/null\n+++ b/mod.py\n@@ -0,0 +1,2 @@\n+def f():\n+    return 1\n"


def task(f2p: list[str], p2p: list[str]) -> Task:
    return Task(
        id="skips", instruction="add mod.f", setup_commands=[f"printf %s {shlex.quote(TESTS)} > test_x.py"],
        test_command="python -m pytest -rA -p no:cacheprovider test_x.py", fail_to_pass=f2p, pass_to_pass=p2p,
        gold_patch=GOLD,
    )  # fmt: skip


async def test_a_skipped_pass_to_pass_test_is_not_broken(runtime, new_sandbox):
    async def check(t: Task) -> bool:
        report = await grade(t, GOLD, runtime=runtime, make_sandbox=lambda: new_sandbox(grading_spec(t)))
        assert report.pass_to_pass.get("test_x.py::test_skipped", "SKIPPED") == "SKIPPED", report
        return report.resolved

    assert await check(task(["test_x.py::test_fixed"], ["test_x.py::test_skipped"]))
    assert not await check(task(["test_x.py::test_fixed", "test_x.py::test_skipped"], []))
