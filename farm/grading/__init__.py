"""Grading: apply the model's diff in a fresh sandbox, run the tests or verifiers, reward.

Public API: ``grade`` / ``grade_in_sandbox`` / ``grading_spec`` (grader), ``GradingReport``
/ ``GradeStatus`` (report), ``log_format`` / ``get_parser`` / ``register`` / ``TestStatus`` /
``TestIds`` (parsers: formats, SWE-bench's names, listed ids),
``validate_task`` / ``validate_tasks`` (validate).
"""

from farm.grading.grader import SandboxMaker, grade, grade_in_sandbox, grading_spec
from farm.grading.parsers import PARSERS, TestIds, TestStatus, get_parser, log_format, register
from farm.grading.report import GradeStatus, GradingReport, PatchReport
from farm.grading.validate import TaskValidation, validate_task, validate_tasks

__all__ = [
    "PARSERS",
    "GradeStatus",
    "GradingReport",
    "PatchReport",
    "SandboxMaker",
    "TaskValidation",
    "TestIds",
    "TestStatus",
    "get_parser",
    "grade",
    "grade_in_sandbox",
    "grading_spec",
    "log_format",
    "register",
    "validate_task",
    "validate_tasks",
]
