"""SWE-bench's PASS_TO_PASS rule, graded for real: a P2P test may be skipped; a F2P one may not."""

from __future__ import annotations

import shlex

import pytest

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


PARAM_TESTS = (
    "import pytest\n"
    "@pytest.mark.parametrize('v', ['a b', 'a - c', 'select id from tbl;'])\n"
    "def test_param(v):\n    from mod import f\n    assert f() == 1\n"
)


@pytest.mark.slow
async def test_swebench_cut_ids_grade_through_the_probe(runtime, new_sandbox):
    """A row as SWE-bench lists it (parse_log_sqlfluff: ids cut at their first space) grades
    for real: the probe's exact node ids meet the cut ids; the empty patch does not resolve."""
    t = Task(
        id="cut-ids", instruction="add mod.f", setup_commands=[f"printf %s {shlex.quote(PARAM_TESTS)} > test_p.py"],
        test_command="python -m pytest -rA -p no:cacheprovider test_p.py", log_parser="parse_log_sqlfluff",
        fail_to_pass=["test_p.py::test_param[a", "test_p.py::test_param[select"], gold_patch=GOLD,
    )  # fmt: skip
    gold = await grade(t, GOLD, runtime=runtime, make_sandbox=lambda: new_sandbox(grading_spec(t)))
    assert gold.resolved and gold.fail_to_pass == {"test_p.py::test_param[a": "PASSED",
                                                   "test_p.py::test_param[select": "PASSED"}, gold  # fmt: skip
    assert "test_p.py::test_param[a - c]" in gold.tests and not gold.flags  # exact ids, from the probe
    empty = await grade(t, "", runtime=runtime, make_sandbox=lambda: new_sandbox(grading_spec(t)))
    assert not empty.resolved and empty.fail_to_pass["test_p.py::test_param[a"] == "FAILED"
