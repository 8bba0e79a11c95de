"""Row converters: SWE-bench / SWE-Gym / SWE-smith / R2E-Gym / farm rows -> ``Task``.

Each converter takes one row (a dict) and returns a Task, or raises ``RowError`` naming
the offending field. ``detect_format`` guesses a row's format for ``format: auto``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from farm.tasks.environment import BY_CONVENTION, IMAGE_FIELDS
from farm.tasks.model import GitSource, ImageSource, Task
from farm.tasks.patches import paths_after, reverse_patch

_STATUS_ALIASES = {"PASS": "PASSED", "FAIL": "FAILED", "SKIP": "SKIPPED", "OK": "PASSED"}


class RowError(Exception):
    """A malformed row: which field, what is wrong (``problems``: every field that is wrong,
    the first being ``field``/``message``)."""

    def __init__(self, field: str, message: str, more: list[tuple[str, str]] | tuple = ()) -> None:
        super().__init__(message)
        self.field, self.message = field, message
        self.problems: list[tuple[str, str]] = [(field, message), *more]


def _need(row: dict[str, Any], *fields: str) -> None:
    for name in fields:
        value = row.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise RowError(name, "missing or empty")


def _str_or_none(row: dict[str, Any], name: str) -> str | None:
    value = row.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RowError(name, f"expected a string, got {type(value).__name__}")
    return value


def _test_list(row: dict[str, Any], name: str) -> list[str]:
    value = row.get(name)
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise RowError(name, f"not a JSON list: {exc}") from None
    if hasattr(value, "tolist"):  # numpy arrays from some Parquet readers
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RowError(name, "expected a list of test ids")
    return value


def _str_list(row: dict[str, Any], name: str) -> list[str]:
    """An optional list of strings (a JSON string of one too)."""
    value = row.get(name)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RowError(name, "expected a list of strings")
    return value


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model an error's ``loc`` points into (Task, a workspace
    source by its tag, TaskTimeouts, ...), for suggestions; [] when it is not one model."""
    models: list[type[BaseModel]] = [Task]
    for part in loc:
        if isinstance(part, int):  # a list item
            continue
        holder = [m for m in models if part in m.model_fields]
        if holder:
            models = _models_of(holder[0].model_fields[part].annotation)
            continue
        models = [m for m in models if getattr(m.model_fields.get("type"), "default", None) == part]  # a union's tag
    return list(models[0].model_fields) if len(models) == 1 else []


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type holds (one, the variants of a union, none)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_of(a)]


def _problem(err: Any) -> tuple[str, str]:
    """(dotted field, message) of one pydantic error; an unknown key names the closest
    known one (``did you mean 'setup_commands'?``) or lists them."""
    loc = tuple(err["loc"])
    field = ".".join(str(p) for p in loc) or "<row>"
    if err["type"] != "extra_forbidden" or not loc:
        return field, err["msg"]
    known = _fields_at(loc[:-1])
    near = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    hint = f"did you mean '{near[0]}'?" if near else f"known keys here: {', '.join(known)}" if known else ""
    return field, f"unknown key {str(loc[-1])!r}" + (f": {hint}" if hint else "")


def _validated(build: Callable[[], Task], field_map: dict[str, str] | None = None) -> Task:
    try:
        return build()
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field, message = _problem(err)
            top = field.split(".", 1)[0]
            problems.append(((field_map or {}).get(top, field), message))
        raise RowError(*problems[0], problems[1:]) from None


def pytest_command(files: list[str]) -> str:
    """The default test command of SWE-style rows that bring none: pytest -rA over ``files``."""
    return "python -m pytest -rA -p no:cacheprovider " + " ".join(files)


def _test_files_of(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(i.split("::", 1)[0] for i in ids if "::" in i))


# SWE-bench runs the files its test patch leaves, less data files (its harness's NON_TEST_EXTS).
_NOT_TEST_FILES = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")


def test_files_of_patch(test_patch: str) -> list[str]:
    """The files a test run takes from a test patch: those it leaves in the tree (a renamed
    file under its new name; a deleted one not at all: naming a missing file makes pytest
    run nothing), less data files."""
    return [p for p in paths_after(test_patch) if not p.endswith(_NOT_TEST_FILES)]


# --- farm -------------------------------------------------------------------------------
def from_farm(row: dict[str, Any]) -> Task:
    # Parquet fills absent columns with None: drop them so defaults apply.
    clean = {k: v for k, v in row.items() if v is not None}
    return _validated(lambda: Task.model_validate(clean))


# --- SWE-bench / SWE-Gym -------------------------------------------------------------------
_SWEBENCH_FIELDS = {
    "id": "instance_id",
    "instruction": "problem_statement",
    "workspace": "base_commit",
    "gold_patch": "patch",
    "fail_to_pass": "FAIL_TO_PASS",
    "pass_to_pass": "PASS_TO_PASS",
}


def swebench_image(instance_id: str, arch: str = "x86_64") -> str:
    """SWE-bench's docker image naming convention for an instance."""
    return f"swebench/sweb.eval.{arch}.{instance_id.replace('__', '_1776_').lower()}:latest"


# Test ids no run can report, as published (dataset defects): SWE-bench's log parser read
# pytest's progress column of an inner pytest run as a test name ("[100%]", its opening "[",
# or the column run into a separator line: "[100%]-----"), or a test id holds a path of the
# machine the dataset was made on: its network filesystem, /n/fs/ (the temporary directory,
# /n/fs/p-swe-bench/temp/..., and its authors' homes, where pydicom's downloaded test data was
# cached: /n/fs/guest/<user>/.pydicom/data/...).
_NOT_A_TEST = re.compile(r"^\[(\s*\d+%\][-=]*)?$")
_THEIR_MACHINE = re.compile(r"(?<![\w.-])/n/fs/")


def dataset_defects(name: str, ids: list[str]) -> tuple[list[str], list[str]]:
    """(the ids a run can report, a sentence for each one left out)."""
    kept, defects = [], []
    for test in ids:
        if _NOT_A_TEST.match(test.strip()):
            defects.append(f"{name} {test!r} is not a test (SWE-bench's log parser read pytest's progress column "
                           "of an inner run as a test name)")  # fmt: skip
        elif _THEIR_MACHINE.search(test):
            defects.append(f"{name} {test!r} holds a path of the machine the dataset was made on, which no run "
                           "elsewhere reports")  # fmt: skip
        else:
            kept.append(test)
    return kept, defects


def named_image(row: dict[str, Any]) -> str | None:
    """The container image a dataset row names (``image``, ``image_name`` or ``docker_image``), if any."""
    for name in IMAGE_FIELDS:
        value = _str_or_none(row, name)
        if value is not None:
            return value
    return None


def from_swebench(row: dict[str, Any], source: str = "swebench") -> Task:
    _need(row, "instance_id", "repo", "base_commit", "problem_statement")
    f2p, f2p_defects = dataset_defects("FAIL_TO_PASS", _test_list(row, "FAIL_TO_PASS"))
    p2p, p2p_defects = dataset_defects("PASS_TO_PASS", _test_list(row, "PASS_TO_PASS"))
    if not f2p:
        what = "; ".join(f2p_defects) if f2p_defects else "no FAIL_TO_PASS tests"
        raise RowError("FAIL_TO_PASS", f"dataset defect: {what}" if f2p_defects else what)
    test_patch = _str_or_none(row, "test_patch")
    test_cmd = _str_or_none(row, "test_cmd") or _str_or_none(row, "test_command")
    files = test_files_of_patch(test_patch) if test_patch else _test_files_of(f2p + p2p)
    meta_keys = ("version", "environment_setup_commit", "created_at", "hints_text", "difficulty", "eval_script")
    metadata = {k: row[k] for k in meta_keys if row.get(k) not in (None, "")}
    if test_cmd is None:
        if not files:
            raise RowError("test_patch", "no test_cmd and no test files to run")
        test_cmd = pytest_command(files)
        metadata["test_command_default"] = True  # a recipe's test_command may replace it
    if _str_or_none(row, "log_parser") is None:
        metadata["log_parser_default"] = True  # a recipe's log_parser may replace it
    metadata["test_files"] = files
    metadata["source"] = source
    if f2p_defects or p2p_defects:  # left out of the lists, said by validate-tasks
        metadata["dataset_defects"] = f2p_defects + p2p_defects
    named = named_image(row)
    metadata["docker_image"] = named or swebench_image(str(row["instance_id"]))
    if named is None:  # SWE-bench's name for the instance's image, not one the row names (farm.tasks.environment)
        metadata[BY_CONVENTION] = True
    return _validated(
        lambda: Task(
            id=str(row["instance_id"]),
            instruction=str(row["problem_statement"]),
            workspace=GitSource(repo=str(row["repo"]), base_commit=str(row["base_commit"]), url=_str_or_none(row, "repo_url")),
            image=_str_or_none(row, "e2b_template"),
            gold_patch=_str_or_none(row, "patch"),
            test_patch=test_patch,
            test_command=test_cmd,
            fail_to_pass=f2p,
            pass_to_pass=p2p,
            log_parser=_str_or_none(row, "log_parser") or "pytest",  # SWE-bench's parse_log_<name> as they come
            setup_commands=_str_list(row, "setup_commands"),
            base_setup_commands=_str_list(row, "base_setup_commands"),
            env=row.get("env") or {},
            metadata=metadata,
        ),
        _SWEBENCH_FIELDS,
    )


def from_swegym(row: dict[str, Any]) -> Task:
    return from_swebench(row, source="swegym")


def from_swerebench(row: dict[str, Any]) -> Task:
    """SWE-rebench: SWE-bench's format, its own images (``swerebench/sweb.eval.x86_64.<id>``)."""
    return from_swebench(row, source="swerebench")


# --- SWE-smith ----------------------------------------------------------------------------
def from_swesmith(row: dict[str, Any]) -> Task:
    """SWE-smith: ``patch`` *introduces* the bug. The workspace is the (clean) repo at
    ``base_commit`` (default: the mirror's HEAD) with that patch applied as a parentless
    commit; the gold fix is the patch reversed."""
    _need(row, "instance_id", "repo", "patch")
    f2p, p2p = _test_list(row, "FAIL_TO_PASS"), _test_list(row, "PASS_TO_PASS")
    if not f2p:
        raise RowError("FAIL_TO_PASS", "no FAIL_TO_PASS tests")
    repo = str(row["repo"])
    if "/" not in repo:
        repo = f"swesmith/{repo}"
    bug = str(row["patch"])
    try:
        gold = reverse_patch(bug)
    except ValueError as exc:
        raise RowError("patch", f"cannot derive the gold fix: {exc}") from None
    test_cmd = _str_or_none(row, "test_cmd") or _str_or_none(row, "test_command")
    if test_cmd is None:
        files = _test_files_of(f2p + p2p)
        if not files:
            raise RowError("FAIL_TO_PASS", "no test_cmd and test ids are not pytest node ids")
        test_cmd = pytest_command(files)
    statement = _str_or_none(row, "problem_statement")
    if statement is None:
        raise RowError("problem_statement", "missing or empty (SWE-smith rows without an issue text cannot be used)")
    metadata = {"source": "swesmith", "bug_patch": bug}
    image = named_image(row)
    if image is not None:  # the repository's image (SWE-smith names one per repository and commit)
        metadata["docker_image"] = image
    for key in ("image_name", "created_at"):
        if row.get(key):
            metadata[key] = row[key]
    return _validated(
        lambda: Task(
            id=str(row["instance_id"]),
            instruction=statement,
            workspace=GitSource(repo=repo, base_commit=_str_or_none(row, "base_commit") or "HEAD"),
            pre_patch=bug,
            gold_patch=gold,
            test_command=test_cmd,
            fail_to_pass=f2p,
            pass_to_pass=p2p,
            setup_commands=_str_list(row, "setup_commands"),
            base_setup_commands=_str_list(row, "base_setup_commands"),
            metadata=metadata,
        ),
        {"id": "instance_id", "instruction": "problem_statement", "workspace": "repo"},
    )


# --- R2E-Gym --------------------------------------------------------------------------------
def from_r2e(row: dict[str, Any]) -> Task:
    """R2E-Gym: the repo is in the docker image at /testbed; graded by comparing the parsed
    test statuses with ``expected_output_json`` (same tests, same statuses)."""
    _need(row, "docker_image", "expected_output_json")
    statement = _str_or_none(row, "problem_statement") or _str_or_none(row, "prompt")
    if statement is None:
        raise RowError("problem_statement", "missing or empty")
    raw = row["expected_output_json"]
    try:
        expected = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise RowError("expected_output_json", f"not JSON: {exc}") from None
    if not isinstance(expected, dict) or not expected:
        raise RowError("expected_output_json", "expected a non-empty {test: status} object")
    statuses: dict[str, str] = {}
    for name, status in expected.items():
        value = _STATUS_ALIASES.get(str(status).upper(), str(status).upper())
        if value not in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"):
            raise RowError("expected_output_json", f"unknown status {status!r} for {name!r}")
        statuses[str(name)] = value
    image = str(row["docker_image"])
    commit = _str_or_none(row, "commit_hash")
    task_id = _str_or_none(row, "instance_id") or f"r2e-{row.get('repo_name') or 'repo'}-{(commit or image)[:12]}"
    metadata = {"source": "r2e", "docker_image": image}
    for key in ("repo_name", "commit_hash"):
        if row.get(key):
            metadata[key] = row[key]
    return _validated(
        lambda: Task(
            id=task_id,
            instruction=statement,
            workspace=ImageSource(image=image),
            workdir="/testbed",
            image=image,
            gold_patch=_str_or_none(row, "patch"),
            test_command=_str_or_none(row, "test_cmd") or "bash run_tests.sh",
            expected_test_statuses=statuses,
            log_parser="r2e",
            metadata=metadata,
        ),
        {"instruction": "problem_statement"},
    )


CONVERTERS: dict[str, Callable[[dict[str, Any]], Task]] = {
    "farm": from_farm,
    "swebench": from_swebench,
    "swegym": from_swegym,
    "swerebench": from_swerebench,
    "swesmith": from_swesmith,
    "r2e": from_r2e,
}


def detect_format(row: dict[str, Any]) -> str:
    """The most likely format of one row."""
    if "expected_output_json" in row and "docker_image" in row:
        return "r2e"
    if "instance_id" in row and "FAIL_TO_PASS" in row:
        repo = str(row.get("repo") or "")
        if "test_patch" not in row or repo.startswith("swesmith/"):
            return "swesmith"
        return "swebench"
    return "farm"
