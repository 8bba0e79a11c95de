"""The jail's /etc staged in one directory (farm.sandboxes.hostetc): the same entries as the
host's, one bind instead of one per entry, a new stage when the host changes one."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from farm.errors import SandboxError
from farm.sandboxes import hostetc
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.hostview import ETC_ENTRIES
from farm.sandboxes.local import LocalSandbox


@pytest.fixture
def fake_etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    etc = tmp_path / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "ssl" / "certs" / "ca.pem").write_text("CERT\n")
    (etc / "ssl" / "certs" / "ab12.0").symlink_to("ca.pem")  # relative, to a file outside /usr
    (etc / "localtime").symlink_to("/usr/share/zoneinfo/Etc/UTC")  # into /usr: kept a link
    (tmp_path / "elsewhere").write_text("nameserver 10.0.0.1\n")
    (etc / "resolv.conf").symlink_to(tmp_path / "elsewhere")  # outside what the jail sees: copied
    monkeypatch.setattr(hostetc, "_last", {})
    return etc


def test_the_stage_holds_the_entries_as_the_jail_must_see_them(fake_etc: Path, tmp_path: Path) -> None:
    stage = Path(hostetc.staged_etc(str(fake_etc), str(tmp_path / "stages")))
    assert (stage / "hosts").read_text() == "127.0.0.1 localhost\n"
    assert os.readlink(stage / "localtime") == "/usr/share/zoneinfo/Etc/UTC"
    assert not (stage / "resolv.conf").is_symlink() and (stage / "resolv.conf").read_text() == "nameserver 10.0.0.1\n"
    assert (stage / "ssl/certs/ca.pem").read_text() == "CERT\n"
    link = stage / "ssl/certs/ab12.0"  # resolves outside what the jail sees: the file it points at
    assert not link.is_symlink() and link.read_text() == "CERT\n"
    assert (stage / "passwd").read_text() == "" and (stage / "group").read_text() == ""  # each sandbox's over them
    assert not (stage / "shadow").exists() and sorted(p.name for p in stage.iterdir()) == sorted(
        ["hosts", "localtime", "resolv.conf", "ssl", "passwd", "group"])
    assert (tmp_path / "stages").stat().st_mode & 0o777 == 0o700


def test_a_changed_host_entry_gets_a_new_stage(fake_etc: Path, tmp_path: Path, monkeypatch) -> None:
    stages = str(tmp_path / "stages")
    first = hostetc.staged_etc(str(fake_etc), stages)
    (fake_etc / "hosts").write_text("127.0.0.1 localhost farm\n")
    assert hostetc.staged_etc(str(fake_etc), stages) == first  # within RECHECK_S: not looked at again
    monkeypatch.setattr(hostetc, "RECHECK_S", 0.0)
    second = hostetc.staged_etc(str(fake_etc), stages)  # an entry changed: seen at the next check
    assert second != first and Path(second, "hosts").read_text() == "127.0.0.1 localhost farm\n"
    (fake_etc / "ssl" / "certs" / "ca.pem").write_text("NEW CERT, in place\n")
    assert hostetc.staged_etc(str(fake_etc), stages) == second  # inside a directory: the deep check's
    monkeypatch.setattr(hostetc, "DEEP_RECHECK_S", 0.0)
    third = hostetc.staged_etc(str(fake_etc), stages)
    assert third != second and Path(third, "ssl/certs/ca.pem").read_text() == "NEW CERT, in place\n"
    assert hostetc.staged_etc(str(fake_etc), stages) == third  # unchanged: the same stage again
    assert Path(first, "ssl/certs/ca.pem").read_text() == "CERT\n"  # a stage is never changed


def test_a_stage_root_that_is_not_private_is_refused(fake_etc: Path, tmp_path: Path) -> None:
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(SandboxError, match="not a private directory"):
        hostetc.staged_etc(str(fake_etc), str(tmp_path / "open"))


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


async def test_a_jail_sees_the_hosts_entries_through_one_bind(local_cfg: SandboxConfig) -> None:
    sb = await LocalSandbox.create(local_cfg.local, SandboxSpec(labels={"run_id": "etc"}))
    try:
        # every staged file, but links into /proc (mtab: each process's own mounts)
        files = [f"/etc/{n}" for n in ETC_ENTRIES
                 if os.path.isfile(f"/etc/{n}") and not os.path.realpath(f"/etc/{n}").startswith("/proc/")]
        res = await sb.exec(["sha256sum", *files, "/etc/passwd"])
        assert res.exit_code == 0, res.stderr
        seen = dict(line.split("  ", 1)[::-1] for line in res.stdout.splitlines())
        assert {f: seen[f] for f in files} == {f: _digest(f) for f in files}
        assert seen["/etc/passwd"] == _digest(f"{sb.dir}/etc/passwd")  # the sandbox's own users
        system = list(sb._host.system)
        at = system.index("/etc")
        assert system[at - 2] == "--ro-bind" and system[at - 1].startswith("/tmp/farm-etc-")
        assert not [a for a in system if a.startswith("/etc/") and a not in ("/etc/passwd", "/etc/group")]
    finally:
        await sb.close()
