"""Test ids as SWE-bench lists them: the one place where a FAIL_TO_PASS / PASS_TO_PASS id
meets farm's statuses, whether those came from farm's probe (exact pytest node ids) or from
a parser reading the printed output.

SWE-bench's lists are what its parser of the row's name made of pytest's ``-rA`` summary
lines (``<STATUS> <node id>[ - <message>]``), so a listed id is not always a node id:

- ``parse_log_pytest`` (and its aliases) keeps the first whitespace-separated word after
  the status: ``test_x[a b]`` is listed as ``test_x[a`` and every test whose id starts
  ``test_x[a `` shares that id. Several tests under one listed id resolve as SWE-bench's
  dict does: the line printed last wins, and ``-rA`` prints passes, then (id-less) skips,
  xfails, xpasses (which SWE-bench does not read), errors, failures.
- ``parse_log_pytest_options``: the same, and a parameter that is an absolute path keeps
  only its last part (``test_x[/tmp/a/f.dcm]`` -> ``test_x[/f.dcm]``).
- ``parse_log_pytest_v2``: the whole id, runs of whitespace as one space, control
  characters and ``[<digits>m`` (colour codes) removed; a FAILED line is cut at its first
  `` - `` (even one inside the brackets), other lines keep their `` - <message>``.
- ``parse_log_matplotlib``: the cut after ``MouseButton.LEFT`` / ``.RIGHT`` became ``1`` /
  ``3``; ``parse_log_seaborn``: the cut, PASSED and FAILED lines only.

:class:`TestIds` indexes farm's exact statuses under the row's rule and resolves a listed
id: as the id SWE-bench's parser would have made, else as an exact id (a node id is the
truth: farm resolves it even where v2 lists that test with a message), else without a
`` - <message>`` tail (v2 lists xfails and errors with theirs; farm keeps no messages), else
by SWE-bench's own fallback for ids an older parser cut mid-parameter (more ``[`` than
``]``): every id it prefixes, if they agree on passing or not. Checked against SWE-bench's
own parsers on real runs: ``tests/grading/test_grading_ids_swebench.py``.

:func:`fill_gaps` merges the probe's statuses with a parse of the output (the grader's
merge): the printed ids only add tests the probe did not see.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

from farm.grading.parsers.base import PASSING, IdRule, TestStatus

# The order -rA prints its summary in (P, s, x, X, E, f, pytest 4.6 to 9); SWE-bench keeps the
# last line per id. Skips are printed without ids and SWE-bench has no XPASS status: lowest.
_PRINTED_LAST = {
    TestStatus.SKIPPED: 0,
    TestStatus.XPASS: 1,
    TestStatus.PASSED: 2,
    TestStatus.XFAIL: 3,
    TestStatus.ERROR: 4,
    TestStatus.FAILED: 5,
}
# -rA lines SWE-bench's pytest parsers take an id from: not skips ("SKIPPED [1] t.py:3: why"),
# not XPASS (not one of SWE-bench's statuses).
_READ_BY_PYTEST_PARSERS = frozenset(TestStatus) - {TestStatus.SKIPPED, TestStatus.XPASS}
_OPTION = re.compile(r"(.*?)\[(.*)\]")
_COLOUR = re.compile(r"\[(\d+)m")
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))


def listed_id(test_id: str, status: TestStatus, rule: IdRule) -> str | None:
    """The id SWE-bench's parser (``rule``) lists for the summary line of ``test_id``
    ended with ``status`` (without its message); None when that parser reads no such line."""
    if rule is IdRule.EXACT:
        return test_id
    if status not in _READ_BY_PYTEST_PARSERS:
        return None
    if rule is IdRule.SEABORN and status not in (TestStatus.PASSED, TestStatus.FAILED):
        return None
    line = f"{status.value} {test_id}".split("\n", 1)[0]  # a newline in an id ends its line
    if rule is IdRule.FULL:
        line = _COLOUR.sub("", line).translate(_CONTROL)
        if status is TestStatus.FAILED:
            line = line.split(" - ", 1)[0]
        words = line.split()
        return " ".join(words[1:]) if len(words) > 1 else None
    if rule is IdRule.MATPLOTLIB:
        line = line.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3")
    if status is TestStatus.FAILED:
        line = line.replace(" - ", " ")
    words = line.split()
    if len(words) < 2:
        return None
    word = words[1]
    if rule is IdRule.OPTIONS:
        m = _OPTION.search(word)
        if m:
            main, option = m.groups()
            if option.startswith("/") and not option.startswith("//") and "*" not in option:
                option = "/" + option.split("/")[-1]
            word = f"{main}[{option}]"
    return word


def fill_gaps(exact: Mapping[str, TestStatus], printed: Mapping[str, TestStatus]) -> dict[str, TestStatus]:
    """The probe's ``exact`` statuses, and the ``printed`` ones (a parse of the output) for
    tests the probe did not see (a collection error). A printed id that is one the probe saw
    as the output shows it (cut at a newline, or with a `` - <message>`` a bracket kept on) is
    that test, not another."""
    first_lines = {k.split("\n", 1)[0].strip() for k in exact if "\n" in k}
    out = dict(exact)
    for test_id, status in printed.items():
        if test_id in exact or test_id in first_lines:
            continue
        if any(test_id[:m.start()] in exact for m in re.finditer(" - ", test_id)):
            continue
        out.setdefault(test_id, status)
    return out


class TestIds:
    """farm's statuses (exact ids) and the ids SWE-bench's parser for ``rule`` lists for them."""

    __test__ = False  # not a pytest test class

    def __init__(self, statuses: Mapping[str, TestStatus], rule: IdRule) -> None:
        self.statuses = dict(statuses)
        self.rule = rule
        self.listed: dict[str, TestStatus] = {}
        self._members: dict[str, list[str]] = {}
        for test_id, status in self.statuses.items():
            key = listed_id(test_id, status, rule)
            if key is None:
                continue
            self._members.setdefault(key, []).append(test_id)
            old = self.listed.get(key)
            if old is None or _PRINTED_LAST[status] >= _PRINTED_LAST[old]:
                self.listed[key] = status

    def resolve(self, test_id: str) -> tuple[TestStatus | None, list[str]]:
        """(the status of a listed id, the exact ids it stands for); (None, []) if missing."""
        if test_id in self.listed:
            return self.listed[test_id], self._members[test_id]
        if test_id in self.statuses:
            return self.statuses[test_id], [test_id]
        for m in reversed(list(re.finditer(" - ", test_id))):  # a " - <message>" tail, longest id first
            if test_id[: m.start()] in self.listed:
                key = test_id[: m.start()]
                return self.listed[key], self._members[key]
        if test_id.count("[") > test_id.count("]"):
            prefixed = [k for k in self.listed if k.startswith(test_id)]
            if prefixed and len({self.listed[k] in PASSING for k in prefixed}) == 1:
                return self.listed[prefixed[0]], [m for k in prefixed for m in self._members[k]]
        return None, []

    def status_of(self, test_id: str, missing: str) -> str:
        """The status (a value) of a listed id, ``missing`` when nothing matches it."""
        status, _ = self.resolve(test_id)
        return missing if status is None else status.value

    def closest(self, test_id: str, n: int = 3, margin: float = 0.05) -> list[str]:
        """The reported ids most like ``test_id``, best first: for a listed id that matches
        none, what the run did report (a typo, a renamed test, a parameter spelt otherwise).
        difflib's ratio, at least 0.6 and within ``margin`` of the best (the ids of one test
        file share their path: the others of the file are not suggested)."""
        matcher = difflib.SequenceMatcher(b=test_id)
        scored = []
        for candidate in dict.fromkeys([*self.listed, *self.statuses]):
            matcher.set_seq1(candidate)
            if matcher.real_quick_ratio() >= 0.6 and matcher.quick_ratio() >= 0.6 and (r := matcher.ratio()) >= 0.6:
                scored.append((r, candidate))
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [c for r, c in scored[:n] if r >= scored[0][0] - margin]

    def members(self, test_ids: Iterable[str]) -> list[str]:
        """The exact ids the listed ``test_ids`` stand for (those that match), in order."""
        return list(dict.fromkeys(m for t in test_ids for m in self.resolve(t)[1]))
