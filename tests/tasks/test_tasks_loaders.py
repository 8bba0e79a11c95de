"""Loaders: every format, with malformed rows reported (file, line, field) or raised (strict)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm.errors import TaskFileErrors, TaskLoadError
from farm.images.config import CONDA_TESTBED, ImagesConfig
from farm.tasks.config import TasksConfig
from farm.tasks.formats import detect_format
from farm.tasks.loaders import load_tasks
from farm.tasks.model import GitSource, ImageSource
from farm.tasks.patches import reverse_patch

BUG = """diff --git a/pkg/core.py b/pkg/core.py
index 1111111..2222222 100644
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1,3 +1,3 @@
 def add(a, b):
-    return a + b
+    return a - b
 
"""
TEST_PATCH = """diff --git a/tests/test_core.py b/tests/test_core.py
new file mode 100644
--- /dev/null
+++ b/tests/test_core.py
@@ -0,0 +1,2 @@
+def test_add():
+    assert True
"""


def farm_row(i: int, **extra) -> dict:
    row = {
        "id": f"t{i}",
        "instruction": f"do thing {i}",
        "workspace": {"type": "git", "repo": "acme/thing", "base_commit": "a" * 40},
        "test_command": "python -m pytest -rA",
        "fail_to_pass": ["tests/test_x.py::test_a"],
    }
    row.update(extra)
    return row


def swebench_row(**extra) -> dict:
    row = {
        "instance_id": "acme__thing-1",
        "repo": "acme/thing",
        "base_commit": "b" * 40,
        "patch": BUG,
        "test_patch": TEST_PATCH,
        "problem_statement": "add is broken",
        "hints_text": "",
        "created_at": "2024-01-01",
        "version": "1.0",
        "environment_setup_commit": "c" * 40,
        "FAIL_TO_PASS": json.dumps(["tests/test_core.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["tests/test_other.py::test_ok"]),
    }
    row.update(extra)
    return row


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_farm_jsonl_reports_and_skips_bad_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            farm_row(1),
            "{not json",
            farm_row(2, instruction=""),
            farm_row(3, workspace={"type": "git", "base_commit": "abc123"}),
            "",
            farm_row(4, fail_to_pass='["tests/t.py::a", "tests/t.py::b"]'),
            farm_row(1),
            [1, 2],
        ],
    )
    result = load_tasks(path)
    assert [t.id for t in result.tasks] == ["t1", "t4"]
    assert result.tasks[1].fail_to_pass == ["tests/t.py::a", "tests/t.py::b"]
    got = [(e.line, e.field) for e in result.errors]
    assert got == [(2, "<json>"), (3, "instruction"), (4, "workspace.git"), (7, "id"), (8, "<row>")]
    assert all(e.path == str(path) for e in result.errors)
    assert "duplicate task id 't1'" in str(result.errors[3])
    assert list(result) == result.tasks and len(result) == 2


def test_strict_refuses_the_file_naming_every_bad_row_at_once(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "tasks.jsonl", [farm_row(1), farm_row(2, instruction=""), "{bad"])
    with pytest.raises(TaskFileErrors) as info:
        load_tasks(path, strict=True)
    assert isinstance(info.value, TaskLoadError) and (info.value.line, info.value.field) == (2, "instruction")
    assert [(e.line, e.field) for e in info.value.errors] == [(2, "instruction"), (3, "<json>")]
    msg = str(info.value)
    assert f"{path}: 2 problem(s) in 2 row(s):" in msg
    assert f"{path}:2: field 'instruction'" in msg and f"{path}:3: field '<json>'" in msg


def test_every_problem_of_a_row_is_reported_and_unknown_keys_get_a_suggestion(tmp_path: Path) -> None:
    """A row with several wrong fields reports each (not pydantic's first); a misspelled
    key names the field it probably meant, at any depth (a workspace source by its type)."""
    row = farm_row(1, setup_comands=["pip install -e ."], timeouts={"agent": 60},
                   workspace={"type": "git", "repo": "acme/x", "base_comit": "abc123"})  # fmt: skip
    path = write_jsonl(tmp_path / "t.jsonl", [row, farm_row(2, instruction="", zzz=1)])
    errors = load_tasks(path).errors
    by_field = {(e.line, e.field): str(e) for e in errors}
    assert set(by_field) == {(1, "setup_comands"), (1, "timeouts.agent"), (1, "workspace.git.base_comit"),
                             (1, "workspace.git.base_commit"), (2, "instruction"), (2, "zzz")}  # fmt: skip
    assert "unknown key 'setup_comands': did you mean 'setup_commands'?" in by_field[(1, "setup_comands")]
    assert "did you mean 'agent_s'?" in by_field[(1, "timeouts.agent")]
    assert "did you mean 'base_commit'?" in by_field[(1, "workspace.git.base_comit")]
    assert "Extra inputs are not permitted" not in "".join(by_field.values())
    assert "unknown key 'zzz': known keys here: id, instruction, workspace" in by_field[(2, "zzz")]


def test_a_file_without_one_valid_task_lists_its_problems(tmp_path: Path) -> None:
    from farm.config import load_config
    from farm.errors import TaskError
    from farm.run.tasks import load_run_tasks

    path = write_jsonl(tmp_path / "t.jsonl", [farm_row(1, instruction=""), farm_row(2, setup_comands=[])])
    with pytest.raises(TaskError) as info:
        load_run_tasks(load_config(None, [f"tasks.path={path}"]))
    msg = str(info.value)
    assert f"no valid task in {path} (2 problem(s)):" in msg
    assert ":1: field 'instruction'" in msg and "did you mean 'setup_commands'?" in msg


def test_a_swe_task_without_a_test_command_is_rejected(tmp_path: Path) -> None:
    row = farm_row(1)
    del row["test_command"]
    result = load_tasks(write_jsonl(tmp_path / "t.jsonl", [row]))
    assert not result.tasks and "test_command" in str(result.errors[0])


def test_farm_parquet_rows(tmp_path: Path) -> None:
    rows = [farm_row(1, metadata=json.dumps({"k": 1})), farm_row(2, instruction=None), farm_row(3)]
    rows[2]["fail_to_pass"] = ["tests/test_x.py::test_a"]
    rows[2]["pass_to_pass"] = None  # absent column values come back as None
    path = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = load_tasks(path)
    assert [t.id for t in result.tasks] == ["t1", "t3"]
    assert result.tasks[0].metadata == {"k": 1}
    assert [(e.line, e.field) for e in result.errors] == [(2, "instruction")]


def test_swebench_rows(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "swe.jsonl",
        [
            swebench_row(),
            swebench_row(instance_id="acme__thing-2", FAIL_TO_PASS="[not json"),
            swebench_row(instance_id="acme__thing-3", base_commit=""),
            swebench_row(instance_id="acme__thing-4", test_cmd="./runtests.py core", image_name="img:1"),
        ],
    )
    result = load_tasks(path, environments=False)  # the conversion alone (environments: test_a_row_needs_...)
    task, custom = result.tasks
    assert task.id == "acme__thing-1" and task.instruction == "add is broken"
    assert task.workspace == GitSource(repo="acme/thing", base_commit="b" * 40)
    assert task.workspace.mirror_name == "acme__thing.git"
    assert task.fail_to_pass == ["tests/test_core.py::test_add"]
    assert task.pass_to_pass == ["tests/test_other.py::test_ok"]
    assert task.gold_patch == BUG and task.test_patch == TEST_PATCH
    assert task.test_command == "python -m pytest -rA -p no:cacheprovider tests/test_core.py"
    assert task.metadata["version"] == "1.0" and task.metadata["environment_setup_commit"] == "c" * 40
    assert task.metadata["docker_image"] == "swebench/sweb.eval.x86_64.acme_1776_thing-1:latest"
    assert custom.test_command == "./runtests.py core" and custom.metadata["docker_image"] == "img:1"
    assert [(e.line, e.field) for e in result.errors] == [(2, "FAIL_TO_PASS"), (3, "base_commit")]
    assert "swebench row" in str(result.errors[0])


def test_swegym_rows_with_plain_lists(tmp_path: Path) -> None:
    row = swebench_row(FAIL_TO_PASS=["tests/test_core.py::test_add"], PASS_TO_PASS=[])
    result = load_tasks(write_jsonl(tmp_path / "gym.jsonl", [row, swebench_row(instance_id="x", problem_statement=None)]),
                        format="swegym", environments=False)  # fmt: skip
    assert result.tasks[0].metadata["source"] == "swegym"
    assert result.tasks[0].fail_to_pass == ["tests/test_core.py::test_add"]
    assert [(e.line, e.field) for e in result.errors] == [(2, "problem_statement")]


def test_swesmith_rows_reverse_the_bug(tmp_path: Path) -> None:
    row = {
        "instance_id": "acme__thing.abc123.func_pm__x1",
        "repo": "acme__thing.abc123",
        "patch": BUG,
        "FAIL_TO_PASS": ["tests/test_core.py::test_add"],
        "PASS_TO_PASS": ["tests/test_core.py::test_other", "tests/test_more.py::test_more"],
        "image_name": "swesmith.x86_64.acme__thing.abc123",
        "problem_statement": "add subtracts",
    }
    bad = {**row, "instance_id": "y", "patch": "GIT binary patch\nliteral 1\n"}
    no_issue = {**row, "instance_id": "z", "problem_statement": ""}
    result = load_tasks(write_jsonl(tmp_path / "smith.jsonl", [row, bad, no_issue]))
    (task,) = result.tasks
    assert detect_format(row) == "swesmith"
    # it names its image: it runs there (the repository at /testbed, its clean commit as the image has it)
    assert task.workspace == ImageSource(image="swesmith.x86_64.acme__thing.abc123", activate=CONDA_TESTBED)
    assert task.workdir == "/testbed" and task.metadata["image_dataset"] == "swesmith"
    mirror = load_tasks(TasksConfig(path=str(tmp_path / "smith.jsonl"), images=ImagesConfig(prefer="recipe")))
    assert mirror.tasks[0].workspace == ImageSource(image="swesmith.x86_64.acme__thing.abc123", activate=CONDA_TESTBED)
    # without it, nothing gives it an environment (no recipe, no setup): refused as it loads (farm.tasks.environment)
    no_image = load_tasks(write_jsonl(tmp_path / "smith2.jsonl", [{k: v for k, v in row.items() if k != "image_name"}]))
    assert [e.field for e in no_image.errors] == ["environment"]
    assert task.pre_patch == BUG
    assert task.gold_patch == reverse_patch(BUG)
    assert "+    return a + b" in task.gold_patch
    assert task.test_command.endswith("tests/test_core.py tests/test_more.py")
    assert [(e.line, e.field) for e in result.errors] == [(2, "patch"), (3, "problem_statement")]


def test_r2e_rows_expected_statuses(tmp_path: Path) -> None:
    row = {
        "repo_name": "thing",
        "docker_image": "namanjain12/thing_final:abc",
        "commit_hash": "d" * 40,
        "problem_statement": "fix it",
        "expected_output_json": json.dumps({"TestA.test_one": "PASSED", "test_two": "FAILED"}),
    }
    bad = {**row, "commit_hash": "e" * 40, "expected_output_json": json.dumps({"t": "MAYBE"})}
    result = load_tasks(write_jsonl(tmp_path / "r2e.jsonl", [row, bad]))
    (task,) = result.tasks
    assert task.kind == "swe" and task.log_parser == "r2e"
    assert task.expected_test_statuses == {"TestA.test_one": "PASSED", "test_two": "FAILED"}
    assert task.workspace == ImageSource(image="namanjain12/thing_final:abc") and task.workdir == "/testbed"
    assert task.image == "namanjain12/thing_final:abc"
    assert [(e.line, e.field) for e in result.errors] == [(2, "expected_output_json")]


def test_json_array_file_and_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([farm_row(1), farm_row(2, id="")]))
    result = load_tasks(path)
    assert [t.id for t in result.tasks] == ["t1"] and result.errors[0].field == "id"
    other = tmp_path / "tasks.csv"
    other.write_text("x")
    assert load_tasks(other).errors[0].field == "<file>"
    assert load_tasks(tmp_path / "missing.jsonl").errors[0].field == "<file>"


def test_demo_set_via_config(tasks_cfg: TasksConfig) -> None:
    result = load_tasks(tasks_cfg)
    assert result.ok and len(result.tasks) == 13
    kinds = [t.kind for t in result.tasks]
    assert kinds.count("swe") == 10 and kinds.count("generic") == 3
    assert {t.log_parser for t in result.tasks if t.kind == "swe"} == {"pytest", "unittest", "junit"}
    assert any(t.reward_file for t in result.tasks) and any(t.setup_commands for t in result.tasks)
    for task in result.tasks:
        assert task.gold_patch, task.id
        if task.kind == "swe":
            assert task.fail_to_pass and task.pass_to_pass and task.test_patch, task.id


def test_current_swebench_rows_and_recipes(tmp_path: Path) -> None:
    """A row as SWE-bench ships it today (parse_log_<name>, image, eval_script) loads without
    hand edits; a recipe (repo -> version -> spec) fills what its image would have held."""
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text(
        "acme/thing:\n"
        "  '1.0':\n"
        "    python: '3.11'\n"
        "    setup: [uv venv -q .venv, uv pip install -q --python .venv/bin/python pytest]\n"
        "    env: {A: '1'}\n"
        "    test_command: .venv/bin/python -m pytest -rA {test_files}\n"
        "  '*':\n"
        "    setup: [echo any-version]\n"
    )
    rows = [
        swebench_row(log_parser="parse_log_pytest_v2", image="docker.io/acme:1", eval_script="#!/bin/bash\nrun"),
        swebench_row(instance_id="acme__thing-2", version="2.0", env={"A": "row"}),
        swebench_row(instance_id="acme__thing-3", test_cmd="./run.sh", setup_commands=["row's own"]),
        swebench_row(instance_id="other__x-1", repo="other/x"),
    ]
    path = write_jsonl(tmp_path / "swe.jsonl", rows)
    # the first names its image: by default it runs there, graded by its own eval script
    in_image = load_tasks(path, format="swebench", recipes=recipes).tasks[0]
    assert in_image.workspace == ImageSource(image="docker.io/acme:1", base_commit="b" * 40, activate=CONDA_TESTBED)
    assert in_image.test_command == "{\n#!/bin/bash\nrun\n} 2>&1" and in_image.metadata["graded_by"] == "eval_script"
    assert not in_image.setup_commands and in_image.python is None and in_image.workdir == "/testbed"
    # with tasks.images.prefer: recipe, the recipe gives its environment instead
    cfg = TasksConfig(path=str(path), format="swebench", recipes=str(recipes), images=ImagesConfig(prefer="recipe"))
    result = load_tasks(cfg)
    t1, t2, t3 = result.tasks
    assert t1.log_parser == "parse_log_pytest_v2" and t1.metadata["docker_image"] == "docker.io/acme:1"
    assert t1.metadata["eval_script"].startswith("#!/bin/bash") and t1.metadata["recipe"] == "acme/thing@1.0"
    assert t1.setup_commands[0] == "uv venv -q .venv" and t1.python == "3.11" and t1.env == {"A": "1"}
    assert t1.test_command == ".venv/bin/python -m pytest -rA tests/test_core.py"  # {test_files}: the test patch's
    assert t2.setup_commands == ["echo any-version"] and t2.test_command.startswith("python -m pytest")
    assert t2.env == {"A": "row"}
    assert t3.test_command == "./run.sh" and t3.setup_commands == ["row's own"]  # the row's own values win
    # no recipe for that repository, nor setup or image of its own: nothing provides its environment
    assert [(e.line, e.field) for e in result.errors] == [(4, "environment")]
    with pytest.raises(TaskLoadError, match="setup"):
        (tmp_path / "bad.yaml").write_text("acme/thing:\n  '1.0': {setup: 3}\n")
        load_tasks(path, recipes=tmp_path / "bad.yaml")


RENAMING_TEST_PATCH = """diff --git a/test/rules/new_combo_test.py b/test/rules/new_combo_test.py
new file mode 100644
--- /dev/null
+++ b/test/rules/new_combo_test.py
@@ -0,0 +1,2 @@
+def test_new():
+    pass
diff --git a/test/rules/old_combo.py b/test/rules/old_combo_test.py
similarity index 100%
rename from test/rules/old_combo.py
rename to test/rules/old_combo_test.py
diff --git a/test/gone_test.py b/test/gone_test.py
deleted file mode 100644
--- a/test/gone_test.py
+++ /dev/null
@@ -1,2 +0,0 @@
-def test_gone():
-    pass
diff --git a/test/fixtures/expected.yml b/test/fixtures/expected.yml
--- a/test/fixtures/expected.yml
+++ b/test/fixtures/expected.yml
@@ -1 +1 @@
-a: 1
+a: 2
"""


def test_swebench_test_files_are_those_the_test_patch_leaves(tmp_path: Path) -> None:
    """sqlfluff__sqlfluff-1733's test patch renames a test file: the run names its new path only
    (the old one no longer exists, and pytest given a missing path runs nothing); a deleted file
    and data files (SWE-bench's NON_TEST_EXTS) are not run either."""
    path = write_jsonl(tmp_path / "swe.jsonl", [swebench_row(test_patch=RENAMING_TEST_PATCH)])
    (task,) = load_tasks(path, environments=False).tasks
    assert task.metadata["test_files"] == ["test/rules/new_combo_test.py", "test/rules/old_combo_test.py"]
    assert task.test_command.endswith(" test/rules/new_combo_test.py test/rules/old_combo_test.py")


def test_an_unknown_log_parser_is_a_row_error_when_the_rows_load(tmp_path: Path) -> None:
    """What farm run and farm validate-tasks load with (farm.run.tasks.load_task_file):
    a row whose log_parser farm cannot read is reported on its line, before any grading."""
    from farm.config import FarmConfig
    from farm.run.tasks import load_task_file

    def cfg(**tasks) -> FarmConfig:  # tasks.python host: these rows bring no environment (not this test's point)
        return FarmConfig.model_validate({"tasks": {"path": str(path), "python": "host", **tasks}})

    rows = [
        swebench_row(log_parser="parse_log_sqlfluff"),
        swebench_row(instance_id="acme__thing-2", log_parser="parse_log_sqlfuff"),
        swebench_row(instance_id="acme__thing-3", log_parser="parse_log_gotest"),
        swebench_row(instance_id="acme__thing-4", log_parser="parse_log_django"),
    ]
    path = write_jsonl(tmp_path / "swe.jsonl", rows)
    result = load_task_file(cfg())
    assert [t.id for t in result.tasks] == ["acme__thing-1", "acme__thing-4"]
    assert result.tasks[0].log_parser == "parse_log_sqlfluff"  # kept as the row names it
    first, second = (str(e) for e in result.errors)
    assert ":2: field 'log_parser'" in first and "did you mean 'parse_log_sqlfluff'" in first
    assert ":3: field 'log_parser'" in second and "Go test runners" in second
    with pytest.raises(TaskLoadError, match=":2: field 'log_parser'"):
        load_task_file(cfg(strict=True))
    assert len(load_tasks(path, environments=False).tasks) == 4  # farm.tasks alone knows no parsers: the check is the caller's


def test_farm_envs_build_refuses_an_unknown_log_parser_before_building(tmp_path: Path, capsys) -> None:
    """`farm envs build` loads rows as `farm run` does: a row it could never grade is
    skipped with the row error, before any environment is built for it."""
    from farm.cli import main

    path = write_jsonl(tmp_path / "swe.jsonl", [swebench_row(log_parser="parse_log_sqlfuff")])
    rc = main(["envs", "build", str(path), "--set", f"envs.cache_dir={tmp_path / 'envs'}",
               "--set", "tasks.recipes=null", "--set", "tasks.python=host"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1 and "farm envs build: no tasks" in err
    assert ":1: field 'log_parser'" in err and "did you mean 'parse_log_sqlfluff'" in err
    assert not (tmp_path / "envs").exists() or not list((tmp_path / "envs").iterdir())


def test_test_ids_no_run_can_report_are_dataset_defects(tmp_path: Path) -> None:
    """As published: PASS_TO_PASS "[", "[100%]" and "[100%]------" (SWE-bench's log parser read
    pytest's progress column of an inner run as a test name: pytest-dev__pytest-5227) and a FAIL_TO_PASS id holding
    a path of the machine SWE-bench ran on. They are left out of the lists and named; a row with
    no FAIL_TO_PASS left is refused as a dataset defect."""
    theirs = "tests/test_self.py::test_stdin[/n/fs/p-swe-bench/temp/pylint/tmpx/mymodule.py]"
    # pydicom__pydicom-1439: its downloaded test data, cached in an author's home
    home = "pydicom/tests/test_rle_pixel_data.py::TestNumpy_NoRLEHandler::test_can_access_unsupported_dataset[/n/fs/guest/jy1682/.pydicom/data/SC_rgb.dcm-data1]"
    ours = "tests/test_paths.py::test_mount[/tmp/n/fs/x]"  # /n/fs/ inside a path of the run's own
    path = write_jsonl(tmp_path / "swe.jsonl", [
        swebench_row(FAIL_TO_PASS=json.dumps(["tests/test_core.py::test_add", theirs]),
                     PASS_TO_PASS=json.dumps(["[", "[100%]", "[100%]------", "tests/test_other.py::test_ok", home, ours])),
        swebench_row(instance_id="acme__thing-2", FAIL_TO_PASS=json.dumps([theirs])),
    ])  # fmt: skip
    result = load_tasks(path, environments=False)  # the conversion alone
    (task,) = result.tasks
    assert task.fail_to_pass == ["tests/test_core.py::test_add"] and task.pass_to_pass == ["tests/test_other.py::test_ok", ours]
    assert task.metadata["dataset_defects"] == [
        f"FAIL_TO_PASS {theirs!r} holds a path of the machine the dataset was made on, which no run elsewhere reports",
        *(f"PASS_TO_PASS {junk!r} is not a test (SWE-bench's log parser read pytest's progress column of an inner "
          "run as a test name)" for junk in ("[", "[100%]", "[100%]------")),
        f"PASS_TO_PASS {home!r} holds a path of the machine the dataset was made on, which no run elsewhere reports",
    ]
    (err,) = result.errors
    assert err.field == "FAIL_TO_PASS" and "dataset defect: FAIL_TO_PASS" in str(err) and "/n/fs/p-swe-bench/" in str(err)
