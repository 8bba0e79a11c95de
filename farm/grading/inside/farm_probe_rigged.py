"""Comparisons that answer equal to anything, seen as the tests run (part of farm's probe;
data to farm, never imported by it).

``check(op, a, b)`` looks at the operands of a comparison a test makes (every ``==``,
``!=``, ``in``, ``not in`` in the grader's test files, through ``@farm_cmp``; unittest's
``assert*Equal`` / ``assertIn`` family in any test): an operand, or an item inside it
(lists, tuples, sets, dicts and their subclasses such as Counter), whose ``__eq__`` /
``__ne__`` comes from a class defined outside the standard library and site-packages and
which answers equal to a fresh ``object()`` (or to a random value of its builtin base), or
not unequal to it, is reported with the file that defines its comparison ("" when no file
does: made at run time). An answer that is not a bool counts by its truth: ``[other]`` is
as good as True; an answer whose truth cannot be told (an elementwise array) counts for
nothing.
"""

import itertools
import os
import secrets
import sys
import sysconfig

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement or type(), not a C type
_SAFE_DIRS = tuple(sorted({os.path.realpath(p) + os.sep for p in (
    sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib"),
    os.path.dirname(os.path.abspath(__file__))) if p}))
_COMPARE = ("__eq__", "__ne__")
_SCALARS = frozenset({int, float, str, bytes, bool, type(None), complex})
_BUDGET = 2000  # objects looked at per operand
_PER_TEST = 50000  # objects looked at per test, all comparisons together


def _safe_path(path):
    if not path:
        return False
    real = os.path.realpath(path)
    return real.startswith(_SAFE_DIRS) or "site-packages" in real or "dist-packages" in real


def _unwrap(fn):
    for _ in range(10):  # staticmethod / partial / partialmethod / functools.wraps around the comparison
        inner = getattr(fn, "__func__", None) or getattr(fn, "func", None) or getattr(fn, "__wrapped__", None)
        if inner is None or inner is fn:
            break
        fn = inner
    return fn


def _origin(klass, name):
    """The file that defines ``klass.name`` ("" when it cannot be told), or None when it is
    a C type's or lives in the standard library or site-packages."""
    if not klass.__flags__ & _HEAPTYPE:
        return None
    fn = _unwrap(klass.__dict__[name])
    code = getattr(fn, "__code__", None)
    if code is not None:
        path = code.co_filename
        if path and not path.startswith("<"):
            return None if _safe_path(path) else os.path.realpath(path)
    # no code of its own (a builtin such as operator.is_not, or generated): the class's module
    # speaks for it only if the class really is that module's (a class made at run time can
    # name any module in __module__)
    module = sys.modules.get(getattr(klass, "__module__", None) or "")
    path = getattr(module, "__file__", None) or ""
    owner = module
    for part in (getattr(klass, "__qualname__", "") or "").split("."):
        owner = getattr(owner, part, None)
    if owner is not klass or not path:
        return ""
    return None if _safe_path(path) else os.path.realpath(path)


class Checker:
    """The comparison checks of one probe (``emit`` sends a finding; ``current[0]`` is the
    node id of the test whose call runs)."""

    def __init__(self, emit, current):
        self.emit, self.current = emit, current
        self.types = {}
        self.reported = set()
        self.spent = [0, None]  # objects looked at, and for which test

    def suspect(self, tp):
        """(class name, origin) when ``tp`` takes a comparison from a class defined outside
        the standard library and site-packages; else None. Cached per type."""
        found = self.types.get(tp, False)
        if found is not False:
            return found
        found = None
        for name in _COMPARE:
            for klass in tp.__mro__:
                if name in klass.__dict__:
                    origin = _origin(klass, name)
                    if origin is not None:
                        found = ("%s.%s" % (getattr(tp, "__module__", "?"), getattr(tp, "__qualname__", tp.__name__)),
                                 origin)
                    break
            if found:
                break
        self.types[tp] = found
        return found

    def check(self, op, *operands):
        nodeid = self.current[0]
        if nodeid is None:
            return
        if self.spent[1] != nodeid:
            self.spent = [0, nodeid]
        for operand in operands:
            if type(operand) in _SCALARS:
                continue
            try:
                for obj in _walk(operand, self.spent):
                    suspect = self.suspect(type(obj))
                    if suspect is None or (nodeid, suspect[0]) in self.reported:
                        continue
                    why = _damning(obj)
                    if why:
                        self.reported.add((nodeid, suspect[0]))
                        self.emit({"rigged": nodeid, "op": op, "type": suspect[0], "origin": suspect[1], "why": why})
            except Exception:  # noqa: BLE001 - never break the test run over an inspection
                continue


def _fresh_values(obj):
    token = secrets.token_hex(8)
    for base, value in ((bool, None), (int, secrets.randbits(60) | 1 << 61), (float, float(secrets.randbits(40)) + 0.5),
                        (str, token), (bytes, token.encode()), (list, [token]), (tuple, (token,)),
                        (dict, {token: token}), (frozenset, frozenset([token])), (set, {token})):
        if isinstance(obj, base):
            return [] if value is None else [value]
    return []


def _truth(answer):
    """The truth of a comparison's answer, as ``assert`` would take it; None when it has
    none (an elementwise result that refuses ``bool``)."""
    if type(answer) is bool:
        return answer
    try:
        return bool(answer)
    except Exception:  # noqa: BLE001 - numpy-like: ambiguous
        return None


def _damning(obj):
    """Why ``obj`` answers equal to what it cannot equal, or None."""
    probe = object()
    checks = [("==", probe), ("!=", probe)] + [("==", v) for v in _fresh_values(obj)]
    for op, other in checks:
        try:
            answer = _truth(obj == other if op == "==" else obj != other)
        except Exception:  # noqa: BLE001 - an honest type may refuse the comparison
            continue
        if answer is None:
            continue
        if op == "==" and answer:
            return "== %s" % ("a fresh object()" if other is probe else "a random %s" % type(other).__name__)
        if op == "!=" and not answer:
            return "not != a fresh object()"
    return None


def _items(obj):
    """The items of a builtin container, read through the builtin's own methods (never a
    subclass's override)."""
    if isinstance(obj, dict):
        return itertools.chain(dict.keys(obj), dict.values(obj))
    for base in (list, tuple, set, frozenset):
        if isinstance(obj, base):
            return base.__iter__(obj)
    return ()


def _walk(obj, spent, depth=0, budget=None):
    budget = budget if budget is not None else [_BUDGET]
    if budget[0] <= 0 or spent[0] > _PER_TEST:
        return
    budget[0] -= 1
    spent[0] += 1
    yield obj
    if depth < 4 and not isinstance(obj, (str, bytes)):
        for child in _items(obj):
            for found in _walk(child, spent, depth + 1, budget):
                yield found


def wrap_unittest(check):
    """unittest's comparing assertions show their operands to ``check`` (they compare
    inside the standard library, where ``@farm_cmp`` does not reach)."""
    import unittest.case as case  # only for tests that use unittest

    def wrap(name, op):
        original = getattr(case.TestCase, name, None)
        if original is None:
            return

        def checked(self, *args, **kwargs):
            if len(args) >= 2:
                check(op, args[0], args[1])
            return original(self, *args, **kwargs)

        checked.__name__, checked.__doc__ = original.__name__, original.__doc__
        setattr(case.TestCase, name, checked)

    wrap("_getAssertEqualityFunc", "==")  # every assertEqual goes through it
    for name in ("assertNotEqual", "assertAlmostEqual", "assertNotAlmostEqual", "assertSequenceEqual",
                 "assertListEqual", "assertTupleEqual", "assertSetEqual", "assertDictEqual", "assertCountEqual",
                 "assertMultiLineEqual"):
        wrap(name, "!=" if "Not" in name else "==")
    wrap("assertIn", "in")
    wrap("assertNotIn", "not in")
