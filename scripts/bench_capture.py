#!/usr/bin/env python
"""bench_capture: what taking the agent's diff costs on a repository of real size (part of
what farm adds around the agent).

A git repository of ``--files`` source files (default 6,800 files of ~10 KB: Django's
size) is made and committed on the host, packed and unpacked into a real local sandbox
(bubblewrap) as a git task's workspace is, then changed the way an agent leaves it (one
file edited, one added). ``farm.workspace.capture.capture_diff`` runs on it
``--rounds`` times in two ways, alternated:

  own_index   as shipped: the scratch index starts from the repo's own index
              (``tree_index_script``: its stat data spares hashing unchanged files)
  read_tree   the way before it: the scratch index from the tree alone, so ``git add -A``
              hashes every file. Forced through the same function by flagging one file
              assume-unchanged in the repo's index (the capture then falls back to it)

Both must give the same diff. Last line:
``bench_capture: files=N own_index_ms_p50=… read_tree_ms_p50=… speedup=…``
``--quick``: the smallest size, which the test suite runs
(``tests/scripts/test_scripts_benches.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


# Writes the repository inside the sandbox: files of plausible Python, spread over
# directories of ~50 files as a real package is.
_MAKE_REPO = r"""
import os, sys
n, size = int(sys.argv[1]), int(sys.argv[2])
line = "    value = compute(alpha, beta, gamma)  # a line of ordinary code\n"
for i in range(n):
    d = f"pkg/mod{i // 50:03d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/file{i:05d}.py", "w") as fh:
        fh.write(f"# file {i}\n" + line * (size // len(line)))
"""


async def main_async(args: argparse.Namespace) -> str:
    from farm.sandboxes.base import SandboxSpec
    from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
    from farm.sandboxes.factory import create_sandbox
    from farm.workspace.capture import capture_diff
    from farm.workspace.prepare import Workspace
    from farm.workspace.shell import git_script

    tmp = Path(tempfile.mkdtemp(prefix="bench_capture-"))
    t = time.monotonic()
    repo = tmp / "repo"
    repo.mkdir()
    subprocess.run([sys.executable, "-c", _MAKE_REPO, str(args.files), str(args.file_bytes)], cwd=repo, check=True)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(git + cmd, cwd=repo, check=True)
    tar = tmp / "repo.tar"
    subprocess.run(["tar", "cf", str(tar), "-C", str(repo), "."], check=True)
    print(f"repository: {args.files} files made, committed and packed in {time.monotonic() - t:.1f} s",
          file=sys.stderr)  # fmt: skip
    cfg = SandboxConfig(backend="local", local=LocalSandboxConfig(base_dir=str(tmp / "sandboxes")))
    async with await create_sandbox(cfg, SandboxSpec(labels={"run_id": "bench-capture"})) as sb:
        workdir, scratch = f"{sb.root}/repo", f"{sb.root}/.farm/tasks"

        async def sh(cmd: str, cwd: str = workdir) -> str:
            res = await git_script(sb, cmd, cwd=cwd, timeout=600)
            assert res.exit_code == 0, res.stderr
            return res.stdout

        # as farm brings a git task's workspace in: a tarball made on the host, unpacked in
        # the sandbox (other inodes, ctimes and owner than its index recorded)
        await sb.upload_tarball(str(tar), workdir)
        await sh(f"mkdir -p {scratch}", cwd=sb.root)
        base = (await sh("git rev-parse HEAD")).strip()
        ws = Workspace(task_id="bench", workdir=workdir, scratch=scratch, base_commit=base, baseline_commit=base)
        # what an agent leaves: one file edited, one added
        await sh("echo '# edited' >> pkg/mod000/file00000.py && echo 'new = 1' > pkg/new_module.py")
        flagged = "pkg/mod001/file00050.py"  # unchanged: flagging it only forces the fallback
        times: dict[str, list[float]] = {"own_index": [], "read_tree": []}
        diffs: dict[str, set[str]] = {"own_index": set(), "read_tree": set()}
        for _ in range(args.rounds):
            for way in ("own_index", "read_tree"):
                flag = "--assume-unchanged" if way == "read_tree" else "--no-assume-unchanged"
                await sh(f"git update-index {flag} {flagged}")
                t = time.monotonic()
                captured = await capture_diff(sb, ws)
                times[way].append(time.monotonic() - t)
                diffs[way].add(captured.patch)
        await sh(f"git update-index --no-assume-unchanged {flagged}")
    shutil.rmtree(tmp, ignore_errors=True)
    assert diffs["own_index"] == diffs["read_tree"] and len(diffs["own_index"]) == 1, "the two ways disagree"
    assert "+new = 1" in next(iter(diffs["own_index"])), "the added file is missing"
    own, old = (statistics.median(times[w]) * 1000 for w in ("own_index", "read_tree"))
    for way, ts in times.items():
        print(f"{way}: ms " + " ".join(f"{x * 1000:.0f}" for x in ts), file=sys.stderr)
    return (f"bench_capture: files={args.files} own_index_ms_p50={own:.0f} read_tree_ms_p50={old:.0f} "
            f"speedup={old / own:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=6800, help="source files in the repository (Django: ~6,800)")
    ap.add_argument("--file-bytes", type=int, default=10_000, help="bytes a file")
    ap.add_argument("--rounds", type=int, default=7, help="captures each way, alternated")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs: its figures mean nothing")
    args = ap.parse_args()
    if args.quick:
        args.files, args.rounds = 100, 1
    print(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
