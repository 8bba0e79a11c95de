"""farm's witness, run for real (as the grader starts it in a sandbox, here on the host):
what it signs, and what it sees from outside the processes that report to it."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

from farm.grading.witness import SCRIPT, Witness, inside_source, read_witness

# A client the way the probe and farm_verify talk to the witness: a hello with the chain's
# start, then lines whose MAC chains the one before.
CLIENT = r"""
import hashlib, json, os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["FARM_WITNESS"])
chain = os.urandom(16)
role = sys.argv[1]
s.sendall((json.dumps({"hello": role, "h0": chain.hex()}) + "\n").encode())
def send(obj):
    global chain
    body = json.dumps(obj).encode()
    chain = hashlib.sha256(chain + body).digest()[:16]
    s.sendall(chain.hex().encode() + b" " + body + b"\n")
send({"line": 1})
s.sendall(b"0" * 32 + b' {"injected": true}\n')   # off the chain: someone else's line
send({"line": 2})
if role == "verify":
    send({"reward": 0.25})
    s.recv(1)
    with open(os.environ["FARM_REWARD_FILE"], "w") as fh:  # a write that is not the witness's
        fh.write("1.0")
if "--close" in sys.argv:
    os.close(s.detach())   # the channel closed while the process lives on
    time.sleep(1.5)
sys.exit(3)
"""


def _run(tmp_path: Path, *args: str, watch: Path | None = None) -> tuple[subprocess.CompletedProcess, Witness]:
    directory = tmp_path / "w"
    directory.mkdir(exist_ok=True)
    (directory / SCRIPT).write_text(inside_source(SCRIPT))
    key = secrets.token_bytes(32)
    (directory / "key").write_bytes(key)
    (tmp_path / "client.py").write_text(CLIENT)
    opts = ["--watch", str(watch)] if watch else []
    env = {"PATH": "/usr/bin:/bin", "FARM_REWARD_FILE": str(watch or "")}
    res = subprocess.run([sys.executable, "-S", "-E", "-s", str(directory / SCRIPT), str(directory), *opts, "--",
                          sys.executable, str(tmp_path / "client.py"), *args], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    return res, Witness(directory=str(directory), key=key)


def test_the_witness_signs_what_it_saw_from_outside(tmp_path):
    res, witness = _run(tmp_path, "probe", "--close")
    assert res.returncode == 3, res.stderr  # it exits as the command did
    assert not (Path(witness.directory) / "key").exists()  # read and deleted before the command ran
    text = Path(witness.report_path).read_text()
    rec = read_witness(text, witness.key)
    assert rec.valid and rec.exit_code == 3
    (conn,) = rec.connections.values()
    assert conn.role == "probe" and conn.pid is not None and conn.pid != res.returncode
    assert [json.loads(b) for b in conn.lines] == [{"line": 1}, {"line": 2}] and conn.bad == 1
    assert conn.alive_at_close is True  # closed while its process lived on
    # a report not signed under this run's key, or changed by a byte, is nobody's
    assert not read_witness(text, secrets.token_bytes(32)).valid
    tampered = text.replace('{"line": 2}', '{"line": 9}')
    assert tampered != text and not read_witness(tampered, witness.key).valid
    assert read_witness(None, witness.key).present is False


def test_the_verifiers_reward_is_written_by_the_witness_and_other_writes_are_seen(tmp_path):
    reward = tmp_path / "reward.txt"
    res, witness = _run(tmp_path, "verify", watch=reward)
    rec = read_witness(Path(witness.report_path).read_text(), witness.key)
    assert rec.valid and res.returncode == 3, res.stderr
    (conn,) = rec.connections.values()
    assert rec.rewards == [(conn.cid, 0.25)]
    assert any("close_write" in w for w in rec.file_events), rec.file_events  # the client's own write, not the witness's
    assert conn.alive_at_close is False  # closed when its process ended
    assert reward.read_text() == "1.0"


def test_without_a_key_the_command_runs_as_it_is(tmp_path):
    directory = tmp_path / "w"
    directory.mkdir()
    (directory / SCRIPT).write_text(inside_source(SCRIPT))
    res = subprocess.run([sys.executable, str(directory / SCRIPT), str(directory), "--", "sh", "-c", "echo ran; exit 4"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 4 and res.stdout == "ran\n" and not (directory / "report.jsonl").exists()


def test_the_witness_writes_and_reads_json_as_the_json_module_does(tmp_path):
    """The witness starts without the json and socket modules (their imports were a third of
    its start): its records must still be the text json.dumps(sort_keys=True) makes, and what
    it reads, what json.loads reads."""
    import importlib.util

    path = tmp_path / SCRIPT
    path.write_text(inside_source(SCRIPT))
    spec = importlib.util.spec_from_file_location("farm_witness_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "_json" in vars(mod) and mod.socket.__name__ == "_socket"  # the C halves, where there are
    odd = ["", "plain", 'quo"te \\ back', "tab\tnl\ncr\r\x00\x1f\x7f", "caf\u00e9 \u2603 \U0001f600", "\ufffd", "a" * 5000]
    records = [
        {"e": "start", "pid": 12, "child": 13, "shielded": True, "watch": None, "inotify": False, "t": 0},
        {"e": "line", "c": 1, "ok": False, "b": odd[2] + odd[3], "t": 7},
        {"e": "file", "what": ["close_write", "modify"], "t": 1 << 40},
        {"e": "reward_written", "c": 2, "v": 0.25, "error": odd[4]},
        {"e": "reward_written", "c": 2, "v": float("inf")},
        {"e": "reward_written", "c": 2, "v": -1e-300},
        {"e": "end", "open": [], "z": [1, 2, 3], "a": -7},
        {"sig": secrets.token_hex(32)},
        *({"b": s, "e": "hello"} for s in odd),
    ]
    for rec in records:
        assert mod._dumps(rec) == json.dumps(rec, sort_keys=True), rec
    for text in [json.dumps(r) for r in records] + [' {"hello": "probe", "h0": "ab"} ', "[1, 2]", "3", '"s"', "null",
                                                    "NaN", "-Infinity", '{"reward": 1e400}']:  # fmt: skip
        got, want = mod._loads(text), json.loads(text)
        assert got == want or (got != got and want != want), text
    for bad in ["", " ", "{", '{"a": 1} x', '{"a": 1}{', "[1,]", '"unterminated', "{'single': 1}", "nan", "\x00"]:
        try:
            json.loads(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"json accepts {bad!r}")
        try:
            mod._loads(bad)
        except ValueError:
            continue
        raise AssertionError(f"the witness accepts {bad!r}")
