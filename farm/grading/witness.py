"""farm's witness in a grading sandbox: installing it, the command that starts it, and
reading what it signed (the witness itself is ``inside/farm_witness.py``).

The witness is the parent of one command farm runs for grading (the test command; each
verify command), started before any of the workspace's code. It holds the key (written
from outside into a fresh, randomly named directory, read and deleted by the witness
first), so nothing the code under test runs with can sign for farm; farm's code inside
the run (the pytest probe, the verifier's helper) reports to it over a socket, and it
records from outside those processes what it saw (see its docstring). Its report is one
HMAC over all its records: a report that does not verify was written by someone else.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from farm.sandboxes.base import Sandbox

INSIDE = Path(__file__).parent / "inside"
SCRIPT = "farm_witness.py"
REPORT = "report.jsonl"
# every witness directory starts so (``install_witness``), and ``Witness.command`` names it
# first: what tells a command run under the witness from the others (e.g. CPU accounting)
DIRECTORY_PREFIX = "/tmp/.farm-"


@functools.cache
def inside_source(name: str) -> str:
    """The text of one of the files farm runs inside the sandbox (``inside/``)."""
    return (INSIDE / name).read_text(encoding="utf-8")


@dataclass
class Witness:
    """The witness's directory in one grading sandbox, and the key of its next run."""

    directory: str
    key: bytes

    @property
    def report_path(self) -> str:
        return f"{self.directory}/{REPORT}"

    def command(self, command: str, *, watch: str | None = None) -> str:
        """Bash that runs ``command`` under the witness (``watch``: the reward file whose
        writes it records), or as it is when the sandbox has no ``python3``."""
        script = shlex.quote(f"{self.directory}/{SCRIPT}")
        opts = f" --watch {shlex.quote(watch)}" if watch else ""
        report = shlex.quote(self.report_path)
        # (no process where none is needed: ``rm`` only for an earlier run's report, python3
        # looked up by bash's builtin, not in a subshell)
        return (f'if [ -e {report} ] || [ -L {report} ]; then rm -f {report}; fi\n'
                f'if command -v python3 >/dev/null 2>&1 && [ -f {script} ]; then\n'
                f'  exec python3 -S -E -s {script} {shlex.quote(self.directory)}{opts} -- bash -c {shlex.quote(command)}\n'
                f"fi\n{command}")  # fmt: skip


async def install_witness(sandbox: Sandbox, files: dict[str, str | bytes] | None = None, *,
                          purpose: str = "probe") -> Witness:  # fmt: skip
    """A fresh, randomly named directory outside the workspace with the witness, ``files``
    and a key (written from outside: no command runs)."""
    directory = f"{DIRECTORY_PREFIX}{purpose}-{secrets.token_hex(12)}"
    key = secrets.token_bytes(32)  # as ``rekey`` makes it, written with the rest in one call
    batch: dict[str, str | bytes] = {f"{directory}/{SCRIPT}": inside_source(SCRIPT).encode()}
    batch.update({f"{directory}/{name}": text for name, text in (files or {}).items()})
    batch[f"{directory}/key"] = key
    await sandbox.write_files(batch)
    return Witness(directory=directory, key=key)


async def rekey(sandbox: Sandbox, witness: Witness) -> Witness:
    """A new key for the witness's next run (each run deletes its key: code a command ran
    never sees the key of a later one; ``command`` removes the last run's report)."""
    key = secrets.token_bytes(32)
    await sandbox.write_file(f"{witness.directory}/key", key)
    return Witness(directory=witness.directory, key=key)


@dataclass
class Connection:
    """One connection to the witness: a process of the run that reported to it."""

    cid: int
    pid: int | None = None
    hello: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # bodies of the lines that continue its chain
    bad: int = 0  # lines that do not (written into the socket by someone else)
    alive_at_close: bool | None = None  # None: still open at the end

    @property
    def role(self) -> str:
        return str(self.hello.get("hello", ""))


@dataclass
class WitnessRecord:
    """What the witness signed (``valid``), or why there is nothing to trust."""

    present: bool = False  # a report file was there
    valid: bool = False  # and its signature verifies under this run's key
    connections: dict[int, Connection] = field(default_factory=dict)
    exit_code: int | None = None
    signal: int | None = None
    file_events: list[list[str]] = field(default_factory=list)  # writes to the watched file, not the witness's own
    rewards: list[tuple[int, float]] = field(default_factory=list)  # (connection, value) the witness wrote
    open_at_end: list[int] = field(default_factory=list)
    shielded: bool = False  # the witness made itself non-dumpable


def read_witness(text: str | None, key: bytes) -> WitnessRecord:
    """Verify and read the witness's report (``text``: the file, None if absent)."""
    rec = WitnessRecord(present=text is not None)
    if not text or not key:
        return rec
    body, _, last = text.rstrip("\n").rpartition("\n")
    try:
        sig = json.loads(last)["sig"]
    except (ValueError, KeyError, TypeError):
        return rec
    body += "\n"
    if not hmac.compare_digest(hmac.new(key, body.encode(), hashlib.sha256).hexdigest(), str(sig)):
        return rec
    rec.valid = True
    conns = rec.connections
    for raw in body.splitlines():
        if raw.startswith("L\t"):  # a line that continued its connection's chain
            _, cid_text, line = raw.split("\t", 2)
            conns[int(cid_text)].lines.append(line)
            continue
        event = json.loads(raw)
        kind, cid = event.get("e"), event.get("c")
        if kind == "start":
            rec.shielded = bool(event.get("shielded"))
        elif kind == "open":
            conns[cid] = Connection(cid=cid, pid=event.get("pid"))
        elif kind == "hello":
            try:
                conns[cid].hello = json.loads(event["b"])
            except (ValueError, KeyError):
                conns[cid].bad += 1
        elif kind == "line":
            if event.get("ok"):
                conns[cid].lines.append(event["b"])
            else:
                conns[cid].bad += 1
        elif kind == "close":
            conns[cid].alive_at_close = bool(event.get("alive"))
        elif kind == "file":
            rec.file_events.append(list(event.get("what") or []))
        elif kind == "reward_written":
            rec.rewards.append((cid, float(event.get("v"))))
        elif kind == "exit":
            rec.exit_code, rec.signal = event.get("code"), event.get("signal")
        elif kind == "end":
            rec.open_at_end = list(event.get("open") or [])
    return rec
