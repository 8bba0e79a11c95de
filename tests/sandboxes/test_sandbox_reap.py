"""``farm reap`` on local sandboxes left behind by a run (real processes, real CLI)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from pathlib import Path

from sandbox_testutil import host_pids_with

from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.local import sandbox_pids
from testkit.waits import async_wait_until


async def test_farm_reap_kills_and_removes_a_runs_sandboxes(local_cfg: SandboxConfig) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 7 * 10**6}"
    run_id = f"crashed-{uuid.uuid4().hex[:6]}"
    mine = [await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": run_id})) for _ in range(2)]
    other = await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "other-run"}))
    try:
        for sb in (*mine, other):
            await sb.start(f"sleep {marker}")
        await async_wait_until(lambda: all(sandbox_pids(sb.id) for sb in (*mine, other)), timeout_s=10,
                               what="every sandbox's process running")  # fmt: skip
        labels = json.loads((mine[0].dir / "labels.json").read_text())
        assert labels["labels"]["run_id"] == run_id and labels["sandbox_id"] == mine[0].id

        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "farm", "reap", "--run-id", run_id, "--backend", "local",
            "--set", f"sandbox.local.base_dir={local_cfg.local.base_dir}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err
        assert sorted(out.decode().split()) == sorted(sb.id for sb in mine)
        assert "2 local sandbox(es)" in err.decode()
        for sb in mine:
            assert not sb.dir.exists()
        assert other.dir.exists()
        await async_wait_until(lambda: not any(sandbox_pids(sb.id) for sb in mine), timeout_s=10,
                               what="the run's sandbox processes reaped")  # fmt: skip
        assert sandbox_pids(other.id)  # the other run is untouched
        assert Path(other.root).exists()
        assert (await other.exec("true")).ok
    finally:
        for sb in (*mine, other):
            await sb.close()  # idempotent even after reap removed the directory
    await async_wait_until(lambda: not host_pids_with(f"sleep {marker}"), timeout_s=10, what="no process left")


async def test_reap_removes_half_made_sandboxes_only(local_cfg: SandboxConfig) -> None:
    from farm.sandboxes.local import reap

    run_dir = Path(local_cfg.local.base_dir, "halfrun")
    (run_dir / "empty").mkdir(parents=True)
    (run_dir / "staged").mkdir()
    (run_dir / "staged" / ".labels.json.tmp").write_text("{")
    (run_dir / "foreign").mkdir()
    (run_dir / "foreign" / "data.txt").write_text("not a sandbox")
    assert await reap("halfrun", cfg=local_cfg.local) == []
    assert sorted(p.name for p in run_dir.iterdir()) == ["foreign"]


async def test_a_close_cut_short_leaves_a_dir_reap_still_removes(local_cfg, monkeypatch) -> None:
    """An actor killed while closing a sandbox must not leave an unlabelled remnant:
    the labels file goes last, so ``reap`` still knows the directory is the run's."""
    import farm.sandboxes.local_dirs as local_mod
    from farm.sandboxes.local import reap

    run_id = f"cut-{uuid.uuid4().hex[:6]}"
    sb = await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": run_id}))
    await sb.write_file("work.txt", "x" * 1000)
    real_remove = local_mod._remove_trees

    def dies_midway(paths):  # the first subtree goes, then the process "dies"
        real_remove(paths[:1])
        raise RuntimeError("killed midway")

    monkeypatch.setattr(local_mod, "_remove_trees", dies_midway)
    with contextlib.suppress(RuntimeError):
        await sb.close()
    monkeypatch.setattr(local_mod, "_remove_trees", real_remove)
    assert sb.dir.exists() and (sb.dir / "labels.json").exists()
    assert await reap(run_id, cfg=local_cfg.local) == [sb.id]
    assert not sb.dir.exists()


async def test_a_sandbox_dir_goes_even_where_rm_fails(local_cfg, monkeypatch) -> None:
    """The directories go with one ``rm -rf``; where it fails (a read-only directory, farm not
    root), the tree walk removes what is left, read-only directories included."""
    import shutil

    import farm.sandboxes.local_dirs as local_mod

    sb = await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": f"rm-{uuid.uuid4().hex[:6]}"}))
    res = await sb.exec("mkdir -p ro/deep && echo x > ro/deep/f && chmod 0500 ro/deep ro")
    assert res.exit_code == 0, res.stderr
    monkeypatch.setattr(local_mod, "_RM", shutil.which("false"))
    real_rmtree, walked = local_mod.remove_tree, []
    monkeypatch.setattr(local_mod, "remove_tree", lambda path: (walked.append(path), real_rmtree(path)))
    await sb.close()
    assert not sb.dir.exists()
    # the walk took the subtrees first: the labels file still went last
    assert walked[-1] == sb.dir and len(walked) > 1 and all(p.parent == sb.dir for p in walked[:-1])


def test_base_dir_expands_environment_variables_on_the_node(tmp_path: Path, monkeypatch) -> None:
    """``$VARS`` in base_dir are this node's (a per-node root on a shared disk); an unset one
    is an error, never a directory literally named ``$FARM_NODE_NAME``."""
    import pytest

    from farm.errors import SandboxError
    from farm.sandboxes.config import LocalSandboxConfig
    from farm.sandboxes.local import sandbox_root

    cfg = LocalSandboxConfig(base_dir=str(tmp_path / "sb" / "$FARM_NODE_NAME"))
    monkeypatch.setenv("FARM_NODE_NAME", "w1")
    assert sandbox_root(cfg) == str((tmp_path / "sb" / "w1").resolve())
    monkeypatch.delenv("FARM_NODE_NAME")
    with pytest.raises(SandboxError, match="not set on this node"):
        sandbox_root(cfg)
