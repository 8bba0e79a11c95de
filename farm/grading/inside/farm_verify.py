"""farm's verifier helper for generic tasks: a reward channel the workspace's code cannot
write, and the workspace's code run out of process with a time limit.

Data to farm: the grader copies it into the grading sandbox and puts its directory first
on ``PYTHONPATH`` for every verify command (which farm's witness runs; see
``farm_witness.py``). A verifier written in Python uses it so::

    import farm_verify                      # first: before anything of the workspace runs

    results = farm_verify.call_many("fizzbuzz", "fizzbuzz", [[n] for n in range(1, 31)], timeout=30)
    good = sum(r.ok and r.value == expected(n) for n, r in zip(range(1, 31), results))
    farm_verify.reward(good / 30)

- ``reward(value)``: the verifier's score, sent to the witness over a connection this
  module opens when imported (the witness writes it to ``$FARM_REWARD_FILE`` too, for
  whoever reads the file). Once only. The connection is not inherited by any program the
  verifier starts, and this process makes itself non-dumpable, so no process of the
  sandbox's user can reach its descriptors or memory; a reward from any other connection,
  a second reward, or a write to the reward file that is not the witness's is a finding.
- ``call(module, function, *args, timeout=..., **kwargs)`` / ``call_many(...)``: import
  ``module`` from the workspace and call ``function`` in a fresh Python process (a new
  session, killed whole at the time limit, writing no bytecode); what comes back went
  through JSON: plain ``str`` / ``int`` / ``float`` / ``list`` / ``dict`` values, whose ``==``
  is Python's own (an object rigged to equal anything does not survive the trip).
- ``run(argv, timeout=..., input=None)``: any program of the workspace, the same way.

Import it before anything of the workspace runs in the verifier's process: code imported
into that process could use its channel as the verifier does.
"""

import collections
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys

Result = collections.namedtuple("Result", "ok value error")
Completed = collections.namedtuple("Completed", "returncode stdout stderr timed_out")


class Failed(Exception):
    """The workspace's code could not be run or answered nothing usable (the message says why)."""


_BOOT = r"""
import json, os, sys
out = os.fdopen(int(sys.argv[1]), "w")
request = json.loads(sys.stdin.read())
sys.path.insert(0, os.getcwd())
try:
    import importlib
    fn = getattr(importlib.import_module(request["module"]), request["function"])
except BaseException as exc:
    out.write(json.dumps({"error": "cannot import %s.%s: %s: %s" % (request["module"], request["function"],
                                                                     type(exc).__name__, exc)}))
    out.close()
    os._exit(0)
results = []
for args, kwargs in request["calls"]:
    try:
        value = fn(*args, **kwargs)
        results.append({"ok": json.dumps(value)})
    except BaseException as exc:
        results.append({"error": "%s: %s" % (type(exc).__name__, str(exc)[:500])})
out.write(json.dumps({"results": results}))
out.close()
os._exit(0)
"""


def _nondumpable():
    try:
        import ctypes  # the task's Python may lack it (built without libffi)

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:  # noqa: BLE001 - without it the channel is still not inherited
        pass


def _open():
    path = os.environ.get("FARM_WITNESS")
    if not path:
        return None
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    except OSError:
        return None
    _nondumpable()
    chain = os.urandom(16)
    sock.sendall((json.dumps({"hello": "verify", "h0": chain.hex(), "pid": os.getpid()}) + "\n").encode())
    return [sock, chain]


_LINE = _open()
_GIVEN = []


def reward(value):
    """Send the verifier's reward (a finite float) to farm. Once only."""
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("the reward must be a finite number, not %r" % value)
    if _GIVEN:
        raise RuntimeError("the reward was already given (%r)" % _GIVEN[0])
    _GIVEN.append(value)
    if _LINE is None:  # no witness (no python3 for it): the reward file, as verifiers always could
        path = os.environ.get("FARM_REWARD_FILE")
        if not path:
            raise RuntimeError("no farm witness and no $FARM_REWARD_FILE: nowhere to send the reward")
        with open(path, "w") as fh:
            fh.write(repr(value))
        return
    sock, chain = _LINE
    body = json.dumps({"reward": value}).encode()
    _LINE[1] = hashlib.sha256(chain + body).digest()[:16]
    sock.sendall(_LINE[1].hex().encode() + b" " + body + b"\n")
    sock.settimeout(30)
    try:
        sock.recv(1)  # the witness has written it
    except OSError:
        pass


def _child_env():
    env = {k: v for k, v in os.environ.items() if k not in ("FARM_WITNESS", "FARM_REWARD_FILE")}
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != here)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _spawn(argv, timeout, stdin_data, pass_fds=()):
    """Run ``argv`` in the workspace in a new session; (returncode or None, stdout, stderr)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_child_env(), start_new_session=True, pass_fds=pass_fds)
    try:
        out, err = proc.communicate(stdin_data, timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = proc.communicate()
        return None, out, err


def run(argv, timeout=60, input=None):  # noqa: A002 - as subprocess.run names it
    """Run a program of the workspace out of this process: ``Completed`` (``returncode``
    None and ``timed_out`` when it outlived ``timeout`` seconds; its whole session is killed)."""
    data = input.encode() if isinstance(input, str) else input
    code, out, err = _spawn(list(argv), timeout, data)
    return Completed(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), code is None)


def call_many(module, function, calls, timeout=60):
    """Call ``module.function`` once per entry of ``calls`` (each a list of positional
    arguments, or an ``(args, kwargs)`` pair) in one fresh Python process: a ``Result``
    per call (``ok``, ``value``, ``error``). ``Failed`` when the process gave no answer."""
    normal = []
    for entry in calls:
        if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], dict):
            normal.append([list(entry[0]), entry[1]])
        else:
            normal.append([list(entry), {}])
    read, write = os.pipe()
    try:
        request = json.dumps({"module": module, "function": function, "calls": normal}).encode()
        code, out, err = _spawn([sys.executable, "-c", _BOOT, str(write)], timeout, request, pass_fds=(write,))
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as fh:
        answer = fh.read()
    if code is None:
        raise Failed("%s.%s outlived %s s" % (module, function, timeout))
    try:
        parsed = json.loads(answer.decode("utf-8", "replace"))
    except ValueError:
        tail = err.decode("utf-8", "replace")[-500:]
        raise Failed("%s.%s gave no answer (exit %s): %s" % (module, function, code, tail)) from None
    if "error" in parsed:
        raise Failed(parsed["error"])
    results = []
    for item in parsed.get("results") or ():
        if "ok" in item:
            try:
                results.append(Result(True, json.loads(item["ok"]), None))
            except (TypeError, ValueError):
                results.append(Result(False, None, "the answer is not JSON"))
        else:
            results.append(Result(False, None, str(item.get("error"))))
    if len(results) != len(normal):
        raise Failed("%s.%s answered %d of %d calls" % (module, function, len(results), len(normal)))
    return results


def call(module, function, *args, timeout=60, **kwargs):
    """``module.function(*args, **kwargs)`` in a fresh Python process; its JSON value, or
    ``Failed`` (it raised, or gave no answer)."""
    (result,) = call_many(module, function, [(args, kwargs)], timeout=timeout)
    if not result.ok:
        raise Failed(result.error)
    return result.value
