"""The probe's line to farm's witness (``farm_witness.py``), and the tripwires that report
any reach into it. Data to farm: copied into the grading sandbox, never imported by farm.

The line: a connection to the witness's socket, made when the probe is imported (before
any of the repository's code runs). No key is in this process. Each line's MAC chains the
one before (sha256 of the previous MAC and the line), from a random start sent in the
first line, so the witness marks any line written into the socket by other code: it
cannot continue the chain without the chain's state, which lives only in the locals of a
suspended generator (``_writer``).

Who may write: the writer takes lines only from ``emit``; ``emit`` takes a probe line only
from the probe's own hooks as pluggy calls them (a "tamper" line also from the tripwires; a
"rigged" finding from anywhere: it can only hurt its sender). Anything else is written
as a "tamper" line naming where the call came from.

The tripwires (Python 3.8+: ``sys.addaudithook``, which nothing can remove) report, before
the operation goes ahead, every audited reach for the probe's state or pytest's
machinery from code outside the standard library and site-packages: reading the writer's
or the probe's frames (``gi_frame``, ``tb_frame`` of probe frames), ``gc`` walks, other
threads' frames, profile/trace hooks, rebinding the code or defaults of the probe's
functions or of the tests', functions built from the tests' code, code compiled or built
under a library's, the probe's or a test file's name (or loaded with ``marshal``), the
process's own ``/proc/<pid>/{fd,mem,environ,maps,task}`` opened or listed, ``ctypes`` (as
called by that code, not by a library it uses), a signal sent to the test process itself
or its parent, another audit hook. Once a tripwire's line is with the witness, nothing in this process
can take it back.
"""

import hashlib
import json
import os
import socket
import sys
import sysconfig

_FREE = ("rigged",)  # findings any code may send: they can only hurt their sender


def _code_tree(obj, out, depth=0):
    """Every code object under a function, class or module namespace (nested ones too)."""
    if depth > 6:
        return
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    if code is not None:
        stack = [code]
        while stack:
            c = stack.pop()
            if c not in out:
                out.add(c)
                stack.extend(k for k in c.co_consts if hasattr(k, "co_code"))
    elif isinstance(obj, type):
        for value in list(vars(obj).values()):
            _code_tree(value, out, depth + 1)


def module_codes(*modules):
    out = set()
    for module in modules:
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) == module.__name__:
                _code_tree(value, out)
    return out


def pluggy_codes():
    """The code of pluggy, which calls every hook (captured before the repository's code runs)."""
    out = set()
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "pluggy" or name.startswith("pluggy.") or ".pluggy" in name):
            for value in list(vars(module).values()):
                _code_tree(value, out)
    return out


def _writer(fd, hello, sender, _getframe=sys._getframe, _sha=hashlib.sha256, _write=os.write, _getpid=os.getpid,
            _urandom=os.urandom, _dumps=json.dumps, _finalizing=sys.is_finalizing):
    """The chain's state and the socket live here and nowhere else."""
    pid = _getpid()
    chain = _urandom(16)
    hello = dict(hello, h0=chain.hex(), pid=pid)
    data = (_dumps(hello, sort_keys=True) + "\n").encode()
    while True:
        try:
            while data:
                data = data[_write(fd, data):]
        except OSError:
            pass
        try:
            body = yield
            if _getframe(1).f_code is not sender[0]:
                body = b'{"tamper": "writer", "why": "sent to directly"}'
        except GeneratorExit:
            if _finalizing():
                return
            body = b'{"tamper": "writer", "why": "closed"}'
        except BaseException:  # noqa: BLE001 - thrown into: the line stays open and says so
            body = b'{"tamper": "writer", "why": "thrown into"}'
        if _getpid() != pid:  # a forked child's lines would fork the chain: the parent speaks for the run
            data = b""
            continue
        chain = _sha(chain + body).digest()[:16]
        data = chain.hex().encode() + b" " + body + b"\n"


def open_line(hello, own, roots, hooks):
    """``emit(obj)`` over a fresh connection to the witness, or None (no witness).

    ``own``: the probe's code objects; ``roots``: the code allowed to call a probe hook
    that emits (pluggy's); ``hooks``: a set the tripwires' code is added to (their lines
    are "tamper" lines)."""
    path = os.environ.get("FARM_WITNESS")
    if not path:
        return None
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    except OSError:
        return None
    fd = sock.detach()  # a bare descriptor: no garbage collection closes it, only the process's end
    sender = [None]

    def emit(obj, _getframe=sys._getframe, _dumps=json.dumps):
        kind = next(iter(obj), "")
        if kind not in _FREE:
            frame, inside, tripwire = _getframe(1), False, False
            while frame is not None and frame.f_code in own:
                inside, tripwire = True, tripwire or frame.f_code in hooks
                frame = frame.f_back
            ok = inside and (frame is not None and frame.f_code in roots or kind == "tamper" and tripwire)
            if not ok:
                where = frame.f_code.co_filename if frame is not None else ""
                obj = {"tamper": "emit", "kind": kind, "origin": where}
        try:
            writer.send(_dumps(obj, sort_keys=True).encode())
        except (StopIteration, ValueError):  # closed at the end, or re-entered from a tripwire
            pass

    sender[0] = emit.__code__
    writer = _writer(fd, hello, sender)
    next(writer)
    return emit


# --- tripwires ----------------------------------------------------------------------------------

_LIBRARY = tuple(sorted({os.path.realpath(p) + os.sep for p in (
    sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p}))


def preloaded_files():
    """The files of every module imported before the probe: the interpreter's, pytest's and
    its plugins' (for a repository that is pytest itself, its own sources too): they ran
    before any test module, so none of them is the code under test acting."""
    out, dirs = set(), {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            out.add(path)
            out.add(_realpath(path, dirs))
    return frozenset(out)


def _realpath(path, dirs):
    """``os.path.realpath(path)``, each directory resolved once (``dirs``: directory -> its real
    path): a test run has loaded a few hundred modules from a few dozen directories, and a
    whole resolution costs an ``lstat`` a component (~6 ms a run of pytest's alone). Only a
    file that is itself a link, or a name that is not a file's, is resolved whole."""
    head, tail = os.path.split(path)
    if not tail or tail in (os.curdir, os.pardir) or os.path.islink(path):
        return os.path.realpath(path)
    real = dirs.get(head)
    if real is None:
        real = dirs[head] = os.path.realpath(head or os.curdir)
    return os.path.join(real, tail)


def _library(path, probe_dir, preloaded=frozenset()):
    return (path.startswith(_LIBRARY) or path.startswith(probe_dir) or "site-packages" in path
            or "dist-packages" in path or path.startswith("<frozen") or path in preloaded)


def install_tripwires(emit, own, hooks, probe_dir, is_test_code, preloaded=frozenset(), guarded=(), report_limit=200):
    """Add the audit hook (Python 3.8+); False when this Python has none. ``guarded``: the
    code of the generators whose locals hold what nothing else may read (the writer's
    chain and socket, the fixed test code)."""
    if not hasattr(sys, "addaudithook"):
        return False
    probe_dir = os.path.realpath(probe_dir) + os.sep
    pids = {str(os.getpid()), str(os.getppid()), "self", "thread-self"}
    guarded = frozenset(guarded) | {_writer.__code__}
    busy = [False]
    sent = set()
    frames = ("gi_frame", "cr_frame", "ag_frame", "tb_frame")
    rebinds = ("__code__", "__defaults__", "__kwdefaults__")
    walks = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.setprofile",
             "sys.settrace", "sys.addaudithook", "sys.monitoring.register_callback", "ctypes.dlopen", "ctypes.dlsym",
             "ctypes.cdata", "ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at")
    events = frozenset(walks + ("object.__getattr__", "object.__setattr__", "code.__new__", "compile", "marshal.loads",
                                "function.__new__", "open", "os.listdir", "os.scandir", "os.kill"))

    def actor(frame, whole, skip=""):
        """The code of the first frame outside the standard library, site-packages and the
        probe, above the frames of ``skip`` (a package dir): ``whole`` walks the stack up,
        else only the direct caller counts."""
        while frame is not None and skip and skip in frame.f_code.co_filename:
            frame = frame.f_back
        while frame is not None:
            if not _library(frame.f_code.co_filename, probe_dir, preloaded):
                return frame.f_code
            if not whole:
                return None
            frame = frame.f_back
        return None

    def proc_path(path):
        """/proc/<self or parent>/{fd,mem,environ,maps,task...}: the process's insides."""
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        if not isinstance(path, str) or not path.startswith("/proc/"):
            return False
        parts = path.split("/")
        return len(parts) >= 4 and parts[2] in pids and parts[3] in ("fd", "mem", "environ", "maps", "task")

    def relevant(event, args):
        """(walk the whole stack?, detail) when the event reaches for what the probe guards."""
        if event.startswith("ctypes."):
            return "ctypes", ""
        if event == "gc.get_referents":
            # reaches only what the caller already holds: a library's own (pandas checks a frame it
            # was given for copies) is not the code's doing; only a direct call of the code counts
            return False, ""
        if event in walks:
            return True, ""
        if event == "object.__getattr__":
            obj, name = args[0], args[1]
            if name in frames:
                frame = getattr(obj, "tb_frame", None) if name == "tb_frame" else obj
                code = getattr(frame, "f_code", None) or getattr(obj, "gi_code", None) or getattr(obj, "cr_code", None)
                return (True, name) if code in guarded else None
            return None
        if event == "object.__setattr__":
            obj, name = args[0], args[1]
            code = getattr(obj, "__code__", None)
            return (True, name) if name in rebinds and (code in own or is_test_code(code)) else None
        if event == "function.__new__":
            return (True, "function from a test's code") if is_test_code(args[0]) or args[0] in own else None
        if event in ("code.__new__", "compile"):
            name = args[1] if len(args) > 1 else ""
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            return (False, name) if isinstance(name, str) and name and not name.startswith("<") and (
                _library(os.path.realpath(name), probe_dir, preloaded) or is_test_code(name)) else None
        if event == "marshal.loads":
            return False, ""
        if event in ("open", "os.listdir", "os.scandir"):
            return (True, str(args[0])) if args and proc_path(args[0]) else None
        if event == "os.kill":
            return (True, "signal %s" % args[1]) if str(args[0]) in pids else None
        return None

    def hook(event, args, _getframe=sys._getframe):
        if event not in events or busy[0]:
            return
        busy[0] = True
        try:
            caller = _getframe(1)
            found = relevant(event, args) if caller.f_code not in own else None  # the probe's own doing
            if found is not None:
                code = actor(caller, found[0] is True, "/ctypes/" if found[0] == "ctypes" else "")
                # the file and the function that did it: the grader compares them with the run
                # without the diff (a project's own profiler is not the diff's tampering)
                where = (code.co_filename, code.co_name) if code is not None else None
                if where is not None and (event, where) not in sent and len(sent) < report_limit:
                    sent.add((event, where))
                    emit({"tamper": event, "origin": where[0], "function": where[1], "detail": str(found[1])[:200]})
        except Exception:  # noqa: BLE001 - a tripwire never breaks the run it watches
            pass
        finally:
            busy[0] = False

    hooks.add(hook.__code__)
    sys.addaudithook(hook)
    return True
