"""farm's witness: the parent of one command farm runs in a grading sandbox (the test
command; a verify command), started before any of the workspace's code runs.

    python3 -S -E -s farm_witness.py DIR [--watch PATH] -- COMMAND...

It reads and deletes ``DIR/key`` first (nothing of the workspace has run yet), makes
itself non-dumpable (no process of the sandbox's user can then read its memory, open its
descriptors or environment through /proc), listens on ``DIR/w.sock`` and runs COMMAND
with ``FARM_WITNESS`` naming that socket. farm's code inside the run (the pytest probe,
the verifier's helper ``farm_verify``) connects and reports there; the key never enters
their processes, so nothing the code under test can reach signs for farm.

What it records, in order of arrival, as seen from outside those processes: each
connection (the peer's pid, from the kernel), each line on it (the probe chains its
lines: each line's MAC covers the one before, so a line written into the socket by
anyone else does not continue the chain and is marked), whether the peer was still alive
when its connection closed (a channel closed or replaced by the code under test), the
writes to the reward file (``--watch``: inotify; its own write of the verifier's reward
excepted), how COMMAND ended. When COMMAND has ended and every connection is closed (or
after a grace), it writes ``DIR/report.jsonl``: those records (one JSON object a line; a
line that continued its chain as ``L<tab>connection<tab>line``) and, last, an HMAC of all
of them under the key; then it exits as COMMAND did.
"""

import hashlib
import hmac
import os
import select
import struct
import sys
import time

# The C halves of json and socket: the modules around them import re, enum and selectors,
# which took a third of the witness's start (a start every graded test command pays). The
# C encoder and scanner are the ones json.dumps and json.loads use: the same text both ways.
try:
    import _json
    import _socket as socket

    # (markers, default, encoder, indent, key and item separators, sort_keys, skipkeys, allow_nan):
    # json.dumps(obj, sort_keys=True)'s own encoder
    _ENCODE = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ": ", ", ", True, False, True)

    class _Context:  # what json.loads's scanner reads of its decoder
        strict, object_hook, object_pairs_hook = True, None, None
        parse_float, parse_int = float, int
        parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__

    _SCAN = _json.make_scanner(_Context())

    def _dumps(obj):
        return "".join(_ENCODE(obj, 0))

    def _loads(text):
        """json.loads: one value, whitespace around it; ValueError otherwise."""
        start = len(text) - len(text.lstrip(" \t\n\r"))
        try:
            obj, end = _SCAN(text, start)
        except StopIteration:
            raise ValueError("not JSON") from None
        if text[end:].strip(" \t\n\r"):
            raise ValueError("extra data after the JSON value")
        return obj
except (ImportError, AttributeError, TypeError):  # a Python without them (not CPython): the modules
    import json
    import socket

    def _dumps(obj):
        return json.dumps(obj, sort_keys=True)

    _loads = json.loads

GRACE_S = 3.0  # after COMMAND ended: how long leftover connections may stay open
_IN = {"modify": 0x2, "close_write": 0x8, "moved_from": 0x40, "moved_to": 0x80, "create": 0x100, "delete": 0x200}


def _nondumpable():
    try:
        import ctypes  # the task's Python may lack it (built without libffi)

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0
    except Exception:  # noqa: BLE001 - no ctypes / no prctl: the witness still works, less shielded
        return False


def _inotify(path):
    """(fd, watched name) for writes to ``path`` (its directory is watched: the file need
    not exist yet), or (None, None)."""
    try:
        import ctypes  # the task's Python may lack it (built without libffi)

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0o4000 | 0o2000000)  # IN_NONBLOCK | IN_CLOEXEC
        if fd < 0:
            return None, None
        mask = 0
        for bit in _IN.values():
            mask |= bit
        directory = os.path.dirname(os.path.abspath(path)) or "/"
        if libc.inotify_add_watch(fd, directory.encode(), mask) < 0:
            os.close(fd)
            return None, None
        return fd, os.path.basename(path)
    except Exception:  # noqa: BLE001
        return None, None


def _file_events(fd, name):
    out = []
    while True:
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return out
        except OSError:
            return out
        if not data:
            return out
        at = 0
        while at + 16 <= len(data):
            _, mask, _, length = struct.unpack_from("iIII", data, at)
            raw = data[at + 16 : at + 16 + length].split(b"\0", 1)[0]
            at += 16 + length
            if raw.decode("utf-8", "replace") == name:
                out.append([k for k, bit in sorted(_IN.items()) if mask & bit])


def _pidfd(pid):
    """A descriptor that turns readable when ``pid`` ends, or None (no pidfd here)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _running(pid):
    """Is ``pid`` still running its program (not gone, not a zombie, not exiting)?"""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X", b"x"):
        return False
    try:
        return not int(fields[6]) & 0x4  # PF_EXITING: its descriptors close because it is ending
    except (IndexError, ValueError):
        return True


class _Conn:
    def __init__(self, cid, sock):
        self.cid, self.sock, self.buf = cid, sock, b""
        self.pid = None
        try:
            self.pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        except OSError:
            pass
        self.chain = None  # the last MAC (bytes) of the probe's chain; None before the hello
        self.role = None
        self.closed_at = None


def main(argv):
    directory = argv[1]
    split = argv.index("--")
    opts, command = argv[2:split], argv[split + 1 :]
    watch = opts[opts.index("--watch") + 1] if "--watch" in opts else None
    key_path = os.path.join(directory, "key")
    try:
        with open(key_path, "rb") as fh:
            key = fh.read()
        os.unlink(key_path)
    except OSError:
        key = b""
    if not key:  # no key: nothing to sign with; run the command as it is
        os.execvp(command[0], command)
    shielded = _nondumpable()
    t0 = time.monotonic()
    records = []

    def note(**fields):
        fields["t"] = int((time.monotonic() - t0) * 1000)
        records.append(_dumps(fields))

    def note_line(cid, body):
        """A line that continues its chain: ``L<tab>connection<tab>body`` (the body as sent)."""
        records.append("L\t%d\t%s" % (cid, body))

    sock_path = os.path.join(directory, "w.sock")
    try:
        if os.path.lexists(sock_path):  # an earlier command's, or planted by what it ran
            os.unlink(sock_path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(sock_path)
        server.listen(128)
    except OSError as exc:  # no witness then, but the command still runs (its report is missing)
        os.write(2, ("farm_witness: cannot listen on %s: %s\n" % (sock_path, exc)).encode())
        os.execvp(command[0], command)
    ino, name = _inotify(watch) if watch else (None, None)
    env = dict(os.environ)
    env["FARM_WITNESS"] = sock_path
    child = os.fork()
    if child == 0:
        try:
            os.execvpe(command[0], command, env)
        except OSError as exc:
            os.write(2, ("farm_witness: cannot run %r: %s\n" % (command[0], exc)).encode())
        os._exit(127)
    note(e="start", pid=os.getpid(), child=child, shielded=shielded, watch=watch, inotify=ino is not None)
    conns = {}
    pending_close = {}  # conn -> deadline to see its peer gone
    status, ended_at, next_id = None, None, 0

    def line(conn, raw):
        text = raw.decode("utf-8", "replace")
        if conn.role is None:
            try:
                hello = _loads(text)
                conn.role = str(hello.get("hello"))
                conn.chain = bytes.fromhex(hello["h0"]) if "h0" in hello else b""
            except (ValueError, TypeError, AttributeError, KeyError):
                conn.role = "?"
                note(e="line", c=conn.cid, ok=False, b=text[:2000])
                return
            note(e="hello", c=conn.cid, b=text)
            return
        mac, _, body = text.partition(" ")
        expect = hashlib.sha256(conn.chain + body.encode("utf-8")).digest()[:16]
        ok = hmac.compare_digest(mac, expect.hex())
        if ok:
            conn.chain = expect
        if ok:
            note_line(conn.cid, body)
        else:
            note(e="line", c=conn.cid, ok=False, b=text[:4000])
        if ok and conn.role == "verify" and body.startswith('{"reward"'):
            write_reward(conn, body)

    def write_reward(conn, body):
        """The verifier's reward: recorded, and written to the reward file by the witness
        itself (so every other write to it is someone else's)."""
        try:
            value = float(_loads(body)["reward"])
        except (ValueError, KeyError, TypeError):
            return
        if ino is not None:
            for what in _file_events(ino, name):
                note(e="file", what=what)
        if watch:
            try:
                with open(watch, "w") as fh:
                    fh.write(repr(value))
                note(e="reward_written", c=conn.cid, v=value)
            except OSError as exc:
                note(e="reward_written", c=conn.cid, v=value, error=str(exc))
        else:
            note(e="reward_written", c=conn.cid, v=value)
        if ino is not None:
            _file_events(ino, name)  # the witness's own write
        try:
            conn.sock.sendall(b"k")
        except OSError:
            pass

    # COMMAND's end wakes the loop through a pidfd (Linux 5.3+, Python 3.9+): no polling while
    # it runs (a wake-up every 50 ms was most of the witness's CPU after its start). Without
    # one, or while a closed connection's peer is watched, the loop polls every 50 ms.
    pidfd = _pidfd(child)
    while True:
        watched = list(conns) + ([server] if server is not None else []) + ([ino] if ino is not None else [])
        if status is None and pidfd is not None:
            watched.append(pidfd)
            timeout = 0.05 if pending_close else None
        elif status is None:
            timeout = 0.05
        else:
            timeout = 0.05 if pending_close else max(0.0, ended_at + GRACE_S - time.monotonic())
        try:
            ready, _, _ = select.select(watched, [], [], timeout)
        except InterruptedError:
            ready = []
        for r in ready:
            if r is pidfd:
                continue  # waited for below
            if r is server:
                try:
                    fd, _ = server._accept()  # (the C socket's accept: a descriptor)
                except OSError:
                    continue
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd)
                next_id += 1
                conn = _Conn(next_id, sock)
                conns[sock] = conn
                note(e="open", c=conn.cid, pid=conn.pid)
            elif r is ino:
                for what in _file_events(ino, name):
                    note(e="file", what=what)
            else:
                conn = conns[r]
                try:
                    data = r.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    if conn.buf:
                        line(conn, conn.buf)
                    conn.closed_at = time.monotonic()
                    pending_close[conn] = conn.closed_at + 0.3
                    del conns[r]
                    r.close()
                    continue
                conn.buf += data
                *lines, conn.buf = conn.buf.split(b"\n")
                for raw in lines:
                    line(conn, raw)
        for conn, deadline in list(pending_close.items()):
            gone = conn.pid is None or not _running(conn.pid)
            if gone or time.monotonic() > deadline:
                note(e="close", c=conn.cid, alive=not gone)
                del pending_close[conn]
        if status is None:
            pid, st = os.waitpid(child, os.WNOHANG)
            if pid:
                status, ended_at = st, time.monotonic()
                note(e="exit", code=os.WEXITSTATUS(st) if os.WIFEXITED(st) else None,
                     signal=os.WTERMSIG(st) if os.WIFSIGNALED(st) else None)
        if status is not None and not pending_close and (not conns or time.monotonic() - ended_at > GRACE_S):
            break
    if pidfd is not None:
        os.close(pidfd)
    if ino is not None:
        for what in _file_events(ino, name):
            note(e="file", what=what)
    server.close()
    try:
        os.unlink(sock_path)
    except OSError:
        pass
    note(e="end", open=sorted(c.cid for c in conns.values()))
    body = "".join(r + "\n" for r in records)
    sig = hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()
    tmp = os.path.join(directory, "report.tmp")
    with open(tmp, "w") as fh:
        fh.write(body + _dumps({"sig": sig}) + "\n")
    os.replace(tmp, os.path.join(directory, "report.jsonl"))
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    os._exit(main(sys.argv))
