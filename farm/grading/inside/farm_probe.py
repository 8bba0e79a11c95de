"""farm's grading probe: the pytest plugin itself (``farm.grading.probe`` installs it).

This file is data to farm: the grader copies it (with ``farm_probe_channel.py``,
``farm_probe_fixed.py``, ``farm_probe_rigged.py``) into the grading sandbox and pytest
loads it with ``-p farm_probe``; farm never imports it. It runs inside the task's
environment, so it keeps to Python 3.6+ and to pytest APIs that pytest 3.6 already had.

It is imported before any conftest or test module. Then, in order: it takes itself out
of ``PYTEST_PLUGINS`` (pytest sessions the tests start must not load it), reads its
``config.json`` and the test files the grader named (``farm_probe_fixed``), connects to
farm's witness (``farm_probe_channel``; no key is in this process), and adds its
tripwires. What it sends the witness, one chained JSON line each:

- ``obs``: after each test's call phase, what ran: whether the test's own code ran (a
  profile hook watching for its code object: for a file the grader named, the function
  compiled from the reset file, found by its place in the file, whatever the item holds
  when the call starts; else the innermost function under the item's decorators, or a
  doctest's examples), whether that code returned or raised out of its own frame
  (``completed``), who called it, whether the call raised (for a TestCase, what unittest
  caught), whether the item's function is still the one collected;
- ``nodeid`` / ``when`` / ``outcome``: pytest's own report of each phase;
- ``rigged``: a comparison in a test on an object rigged to equal anything
  (``farm_probe_rigged``);
- ``plugin``: a plugin registered after the probe, and where its hooks' code lives;
- ``tamper``: the tripwires, and any call into the probe that did not come from pytest;
- ``collect_error``, and at the end ``finished`` with the exit status.

Under pytest-xdist each worker loads the plugin too and opens its own line; the
controller hands its session id to the workers (``pytest_configure_node``), the workers
send the per-test lines, the controller only the end.
"""

import builtins
import json
import os
import sys
import threading

import pytest

import farm_probe_channel as _channel
import farm_probe_fixed as _fixed
import farm_probe_rigged as _rigged

try:
    from _pytest.python import Function as _Function
except ImportError:  # pragma: no cover - every pytest this runs under has it
    _Function = None

_DIR = os.path.dirname(os.path.abspath(__file__))
_ACTIVE = __name__ == "farm_probe"  # imported as farm's own module (a linter, a doc tool): inert


def _config():
    try:
        with open(os.path.join(_DIR, "config.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _unset_plugins_variable():
    """Take this plugin out of ``PYTEST_PLUGINS`` once it is loaded (the task's own entries
    kept): the grader sets it for a test command that replaces ``PYTEST_ADDOPTS`` (a tox.ini's
    setenv), and pytest sessions the tests start themselves, in process or in a subprocess
    (pytest's own suite, through its pytester fixture), inherit it where they never see the
    addopts (pytester clears them): they loaded the probe too and reported their own tests
    and exit as the run's."""
    if "PYTEST_PLUGINS" not in os.environ:
        return
    kept = [p for p in os.environ["PYTEST_PLUGINS"].split(",") if p.strip() and p.strip() != __name__]
    if kept:
        os.environ["PYTEST_PLUGINS"] = ",".join(kept)
    else:
        del os.environ["PYTEST_PLUGINS"]


if _ACTIVE:
    _unset_plugins_variable()
_PRELOADED = _channel.preloaded_files()  # before any repository code: the runner's own files
_CONF = _config() if _ACTIVE else {}
_SNAPSHOT = _fixed.read_snapshot(_CONF) if _ACTIVE else {}
_SESSION = os.urandom(8).hex()
_ROLE = ["main"]  # or "controller" (pytest-xdist's: it relays the workers' reports) or "worker"
_CURRENT = [None]  # node id of the test whose call phase is running
_CONFIG = [None]  # pytest's config: node ids are turned relative to where pytest was started
_COLLECTED = {}  # node id -> the function the item held when collected
_STARTED = [False]  # plugins registered from here on are reported
_HOOKS = set()  # the tripwires' code: the only senders of "tamper" lines besides pytest's hooks
_EMIT = [lambda obj: None]


def _emit(obj):
    _EMIT[0](obj)


_CHECKER = _rigged.Checker(_emit, _CURRENT)
_ASK, _PRECOMPILE = _fixed.install(_SNAPSHOT, _CHECKER.check, _CURRENT) if _ACTIVE else (None, None)


def _id(nodeid):
    """The id as ``pytest -rA`` prints it (SWE-bench's ids come from that output): relative
    to the directory pytest was started in, where pytest's own node ids are relative to its
    rootdir (they differ when a test command runs from below an ini file's directory)."""
    relative = getattr(_CONFIG[0], "cwd_relative_nodeid", None)
    if relative is None or not nodeid:
        return nodeid
    try:
        return str(relative(nodeid))
    except Exception:  # pytest 9 takes a NodeId object
        pass
    try:
        from _pytest.nodeid import NodeId  # pytest 9 only: the task's pytest may be older

        return str(relative(NodeId.parse(nodeid)))
    except Exception:  # an odd node's id: pytest's own is still an id
        return nodeid


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config):
    """Before any conftest: compile the named test files from their reset bytes."""
    if _PRECOMPILE is not None and _ROLE[0] != "controller":
        _PRECOMPILE(early_config)
    yield


def pytest_configure(config):
    _CONFIG[0] = config
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "farm_probe_session" in workerinput:
        _ROLE[0] = "worker"
        _emit({"worker": {"parent": workerinput["farm_probe_session"], "id": workerinput.get("workerid")}})


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: the controller starting a worker
def pytest_configure_node(node):
    _ROLE[0] = "controller"
    node.workerinput["farm_probe_session"] = _SESSION


def pytest_plugin_registered(plugin, manager):
    """Plugins that appear after the probe, from code that is neither a library's nor a
    conftest's nor a test file's (registered at run time by the code under test)."""
    if not _STARTED[0]:
        _STARTED[0] = plugin is sys.modules.get(__name__)
        return
    origin = _plugin_origin(plugin)
    if origin is not None:
        _emit({"plugin": str(manager.get_name(plugin) or type(plugin).__name__)[:200], "origin": origin})


def _plugin_origin(plugin):
    paths = [getattr(plugin, "__file__", None)] if hasattr(plugin, "__file__") else []
    for name in dir(plugin):
        value = getattr(plugin, name, None) if name.startswith("pytest_") else None
        if callable(value):  # a hook, not a variable (a conftest's pytest_plugins)
            fn = _rigged._unwrap(value)
            code = getattr(fn, "__code__", None)
            paths.append(code.co_filename if code is not None else "")
    for path in paths:
        if path is None:
            continue
        base = os.path.basename(path)
        if path and (_rigged._safe_path(path) or path in _PRELOADED or base == "conftest.py"
                     or _ASK(("test_code", path))):  # fmt: skip
            continue
        return os.path.realpath(path) if path and not path.startswith("<") else ""
    return None


def _is_outcome(exc):
    return any(c.__name__ in ("OutcomeException", "Skipped", "XFailed", "Exit") for c in type(exc).__mro__)


# --- did the test's own code run, and end by returning -------------------------------------------


def _chain(obj):
    """The functions from an item's object down to the innermost under its decorators."""
    out = []
    for _ in range(50):  # unittest/mock.patch/functools.wraps decorators keep the test in __wrapped__
        obj = getattr(obj, "__func__", obj)
        out.append(obj)
        inner = getattr(obj, "__wrapped__", None)
        if inner is None or inner is obj:
            break
        obj = inner
    return out


def _body(item):
    """(kind, target, status): kind "code" (target: the code objects to watch for),
    "doctest" (target: the examples' file name prefix) or None (an item of a kind whose
    own code farm does not know); status: how the code was fixed (``farm_probe_fixed``)."""
    dtest = getattr(item, "dtest", None)
    if dtest is not None and getattr(dtest, "examples", None) is not None:
        return "doctest", "<doctest %s[" % dtest.name, None
    if _Function is None or not isinstance(item, _Function):
        return None, None, None
    status, codes = _fixed.expected(_ASK, item)
    if status == "fixed":
        return "code", codes, status
    code = getattr(_chain(getattr(item, "obj", None))[-1], "__code__", None)
    return ("code", (code,), status) if code is not None else (None, None, status)


def _watcher(kind, target, seen, restore):
    ids = {id(c) for c in target} if kind == "code" else None

    def watch(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if id(code) in ids if ids is not None else code.co_filename.startswith(target):
            back = frame.f_back
            seen.append((frame, back.f_code if back is not None else None))
            restore()

    return watch


def _raised(item, outcome):
    exc = outcome.excinfo[1] if outcome.excinfo else None
    if exc is not None and not _is_outcome(exc):
        return True
    for info in item.__dict__.get("_excinfo") or ():  # unittest.TestCase: unittest caught it
        value = getattr(info, "value", None)
        if value is not None and not _is_outcome(value):
            return True
    return False


def _may_swallow(item, caller):
    """Is the caller of the test's code a decorator the test file applied (a wrapper in
    the chain of the function collected, from a library or the test files), which may
    catch what the test raised (expected-exception decorators, hypothesis's examples)?"""
    obj = getattr(item, "obj", None)
    chain = _chain(obj)
    collected = _COLLECTED.get(item.nodeid)
    if collected is not None and collected is not chain[0]:
        return False
    if any(getattr(f, "is_hypothesis_test", False) for f in chain):
        return True
    for fn in chain:
        code = getattr(fn, "__code__", None)
        if code is not None and code is caller:
            return _rigged._safe_path(code.co_filename) or _ASK(("test_code", code))
    return False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item, _getprofile=sys.getprofile, _setprofile=sys.setprofile,
                        _thread_profile=threading.setprofile):
    _wrap_unittest_once()
    kind, target, status = _body(item)
    seen = []
    previous = _getprofile()
    previous_thread = threading.getprofile() if hasattr(threading, "getprofile") else getattr(threading, "_profile_hook", None)

    def restore():
        if _getprofile() is watch:
            _setprofile(previous)
        _thread_profile(previous_thread)

    watch = _watcher(kind, target, seen, restore) if kind is not None else None
    if watch is not None:
        _setprofile(watch)
        _thread_profile(watch)  # a test that runs its body in a thread it starts
    _CURRENT[0] = _id(item.nodeid)
    try:
        outcome = yield
    finally:
        _CURRENT[0] = None
        if watch is not None:
            restore()
    obs = {"obs": _id(item.nodeid), "ran": bool(seen) if kind is not None else None, "raised": _raised(item, outcome),
           "kind": kind or type(item).__name__, "fixed": status}
    if seen and kind == "code":
        frame, caller = seen[0]
        done = _fixed.completed(frame)
        obs["completed"] = done
        if done is False and not _may_swallow(item, caller):
            obs["swallowed"] = True  # its own frame raised; something between pytest and the test caught it
    collected = _COLLECTED.get(item.nodeid)
    if collected is not None and collected is not _chain(getattr(item, "obj", None))[0]:
        obs["obj_changed"] = True
    if getattr(builtins, _fixed.CMP, None) is not _CMP:
        obs["cmp_replaced"] = True
    _emit(obs)


_CMP = getattr(builtins, _fixed.CMP, None)
_UNITTEST = [False]  # True while unittest's assertions are still to be wrapped (the probe's line is open)


def _wrap_unittest_once():
    """Wrap unittest's assertions once the tests themselves imported it: the probe never imports
    it first. pytest avoids importing unittest until a test module does, and a run where it was
    imported up front behaves differently (pytest's own tests of its unittest support, run
    in-process by pytester: with unittest imported by a plugin, a tearDown that pytest calls for a
    class skipped under --pdb is not called, and pytest-dev__pytest-10081's FAIL_TO_PASS test passes
    without the fix)."""
    if _UNITTEST[0] and "unittest.case" in sys.modules:
        _UNITTEST[0] = False
        _rigged.wrap_unittest(_CHECKER.check)


def pytest_assertrepr_compare(config, op, left, right):
    # pytest asks this for failing assertions in files the grader did not name
    _CHECKER.check(op, left, right)


# --- pytest's reports ---------------------------------------------------------------------------


def pytest_collectreport(report):
    for item in getattr(report, "result", None) or ():
        obj = item.__dict__.get("_obj")
        if obj is not None:
            _COLLECTED[item.nodeid] = getattr(obj, "__func__", obj)
    if report.failed and _ROLE[0] != "controller":
        _emit({"collect_error": _id(report.nodeid), "message": str(report.longrepr)[-2000:]})


def pytest_runtest_logreport(report):
    if _ROLE[0] == "controller":  # a worker's report, relayed: the worker wrote it, with its observations
        return
    _emit({"nodeid": _id(report.nodeid), "when": report.when, "outcome": report.outcome,
           "wasxfail": hasattr(report, "wasxfail"), "sub": hasattr(report, "context")})


def pytest_sessionfinish(session, exitstatus):
    if _ROLE[0] == "worker":  # the controller's end is the run's end
        return
    _check_hooks(session.config.pluginmanager)
    _emit({"finished": True, "exitstatus": int(exitstatus), "collected": getattr(session, "testscollected", -1)})


def _check_hooks(manager):
    """Every hook implementation must belong to a registered plugin (one slipped into
    pluggy's lists directly never registered)."""
    try:
        for name in dir(manager.hook):
            caller = getattr(manager.hook, name, None)
            for impl in getattr(caller, "get_hookimpls", lambda: ())():
                if not manager.is_registered(impl.plugin):
                    code = getattr(_rigged._unwrap(impl.function), "__code__", None)
                    _emit({"tamper": "hookimpl", "origin": code.co_filename if code is not None else "", "detail": name})
    except Exception:  # noqa: BLE001 - a pluggy without these APIs: nothing to check
        pass


if _ACTIVE:
    _OWN = _channel.module_codes(sys.modules[__name__], _channel, _fixed, _rigged)
    _line = _channel.open_line({"hello": "probe", "session": _SESSION, "py": list(sys.version_info[:3]),
                                "pytest": getattr(pytest, "__version__", "?"), "tests": len(_SNAPSHOT)},
                               _OWN, _channel.pluggy_codes(), _HOOKS)
    if _line is not None:
        _EMIT[0] = _line
        _UNITTEST[0] = True
        _channel.install_tripwires(_line, _OWN, _HOOKS, _DIR, lambda c: bool(c) and _ASK(("test_code", c)), _PRELOADED,
                                   guarded=(_fixed._vault.__code__,))
