"""What validate-tasks says of a row beyond valid / invalid (farm/grading/validate.py)."""

from __future__ import annotations

from farm.grading.validate import declared_dependencies

# SWE-bench's pylint-dev__pylint-4661 gold patch, its setup.cfg part: a new dependency, and an
# isort list that names other packages (no dependency of the project)
PYLINT_4661_SETUP_CFG = """\
diff --git a/setup.cfg b/setup.cfg
--- a/setup.cfg
+++ b/setup.cfg
@@ -42,6 +42,7 @@ project_urls =
 install_requires =
+    appdirs>=1.4.0
     astroid>=2.6.5,<2.7 # (You should also upgrade requirements_test_min.txt)
@@ -74,7 +75,7 @@ markers =
-known_third_party = astroid, sphinx, isort, pytest, mccabe, six, toml
+known_third_party = appdirs, astroid, sphinx, isort, pytest, mccabe, six, toml
"""


def test_a_dependency_the_gold_patch_declares_is_named():
    """SWE-bench's evaluation installs the checkout again after the patch (with the network):
    a gold patch that adds a dependency resolves there, not in an environment graded offline."""
    assert declared_dependencies(PYLINT_4661_SETUP_CFG, ["appdirs", "six"]) == ["appdirs"]
    pyproject = 'diff --git a/pyproject.toml b/pyproject.toml\n--- a/pyproject.toml\n+++ b/pyproject.toml\n@@ -1 +1,2 @@\n x\n+    "Platform_Dirs[x]>=2",\n'
    assert declared_dependencies(pyproject, ["platform-dirs"]) == ["platform-dirs"]
    lib = "diff --git a/lib.py b/lib.py\n--- a/lib.py\n+++ b/lib.py\n@@ -1 +1,2 @@\n x\n+appdirs\n"
    assert declared_dependencies(lib, ["appdirs"]) == []  # not a file that declares dependencies



async def test_a_system_error_or_a_bug_fails_its_row_and_the_run_goes_on(runtime, tasks_cfg) -> None:
    """A full disk while one row's workspace is packed, or a bug of farm's, fails that row with the
    error as its reason: the rows after it are still validated and each result is reported."""
    import errno

    from farm.grading.validate import validate_tasks
    from farm.tasks.loaders import load_tasks

    full, bug = list(load_tasks(tasks_cfg).by_id().values())[:2]

    async def new_sandbox(spec):
        if spec.labels["task_id"] == full.id:
            raise OSError(errno.ENOSPC, "No space left on device")
        raise KeyError("a bug")

    seen = []
    results = await validate_tasks([full, bug], runtime=runtime, new_sandbox=new_sandbox, concurrency=1,
                                   on_result=seen.append)  # fmt: skip
    assert [r.task_id for r in seen] == [full.id, bug.id] and not any(r.valid for r in results)
    assert results[0].reason == "system error: OSError: [Errno 28] No space left on device (validate it again once fixed)"
    assert results[1].reason == "internal error: KeyError: 'a bug'"
