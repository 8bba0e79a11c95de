"""`farm envs ls` cuts a failed build's reason at a word with an ellipsis and says how to
see it whole; `ls --full` and `farm envs show KEY` print it whole, with the setup steps."""

from __future__ import annotations

from farm.cli import main
from farm.commands.envs import shorten
from farm.envs.store import EnvRecord, EnvStore
from farm.workspace.prepare import SetupReport
from farm.workspace.shell import CommandReport

REASON = ("setup command failed: pip install -e . exited 1: ERROR: Could not find a version that satisfies "
          "the requirement numpy==1.17.3 (from versions: 1.21.0, 1.22.0); "
          "ERROR: No matching distribution found for numpy==1.17.3")  # fmt: skip


def test_shorten_cuts_at_a_word():
    assert shorten("short  reason\nhere", 40) == "short reason here"
    cut = shorten(REASON, 60)
    assert len(cut) <= 60 and cut.endswith("\u2026") and REASON.startswith(cut[:-1])
    assert not REASON[len(cut) - 1].isalnum()  # what follows the kept text is not inside a word
    assert shorten("x" * 100, 20) == "x" * 19 + "\u2026"  # one long word: cut inside it


def test_ls_full_and_show_print_the_reason_whole(tmp_path, capsys):
    store = EnvStore(tmp_path / "envs")
    key = "f" * 64
    step = CommandReport(command="pip install -e .", exit_code=1, duration_s=3.2,
                         stderr_tail="ERROR: No matching distribution found for numpy==1.17.3")  # fmt: skip
    store.publish(store.staging(key), EnvRecord(key=key, ok=False, reason=REASON, mount="/testbed",
                                                task_ids=["acme__x-1"], setup=SetupReport(ok=False, steps=[step])))
    args = ["--set", f"envs.cache_dir={store.root}"]
    assert main(["envs", "ls", *args]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith(key[:12]))
    assert "FAILED" in line and line.endswith("\u2026") and "numpy==1.17.3 (from" not in line
    assert "`farm envs ls --full` or `farm envs show KEY` shows them whole" in out
    assert main(["envs", "ls", "--full", *args]) == 0
    out = capsys.readouterr().out
    assert f"    {REASON}\n" in out and "\u2026" not in out and "--full" not in out
    assert main(["envs", "show", key[:6], *args]) == 0
    out = capsys.readouterr().out
    assert f"key:        {key}" in out and f"  {REASON}" in out and "state:      FAILED" in out
    assert "[1] exit 1 in 3.2 s: pip install -e ." in out and "No matching distribution found" in out
    assert main(["envs", "show", "0", *args]) == 2
    assert "'0' matches 0 snapshots" in capsys.readouterr().err
