"""Workspace preparation and diff capture in real local (bubblewrap) sandboxes."""

from __future__ import annotations

import asyncio
import subprocess
import tarfile
from pathlib import Path

import pytest

from farm.errors import CommitNotFound, PatchApplyError, RepositoryNotFound, SetupCommandFailed, TaskError
from farm.sandboxes.base import SandboxSpec
from farm.workspace.capture import capture_diff
from farm.tasks.loaders import load_tasks
from farm.tasks.model import GitSource, Task, TarballSource, TaskTimeouts
from farm.tasks.repos import RepoCache
from farm.workspace.prepare import prepare_workspace


@pytest.fixture
def demo(tasks_cfg) -> dict[str, Task]:
    return load_tasks(tasks_cfg).by_id()


async def sh(sb, cmd: str, cwd: str) -> str:
    res = await sb.exec(cmd, cwd=cwd, timeout=60)
    assert res.exit_code == 0, res.stderr
    return res.stdout


async def test_workspace_is_the_base_commit_without_the_future(demo, runtime, new_sandbox) -> None:
    task = demo["demo-romans"]
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        ws = await prepare_workspace(sb, task, runtime)
        assert ws.workdir == f"{sb.root}/repo" and ws.base_commit == task.workspace.base_commit
        assert ws.baseline_commit == ws.base_commit  # no setup: nothing to snapshot
        assert (await sh(sb, "git rev-parse --abbrev-ref HEAD", ws.workdir)).strip() == "main"
        assert len((await sh(sb, "git log --oneline --all", ws.workdir)).splitlines()) == 3
        assert (await sh(sb, "git status --porcelain", ws.workdir)) == ""
        # The fix commit exists in the mirror but not in the workspace's object store.
        fix = task.metadata["fix_commit"]
        leak = await sb.exec(f"git cat-file -e {fix}", cwd=ws.workdir, timeout=60)
        assert leak.exit_code != 0
        objects = await sh(sb, "git cat-file --batch-all-objects --batch-check | wc -l", ws.workdir)
        mirror = next(d for d in runtime.repos.mirror_dirs if (d / "acme__romans.git").exists()) / "acme__romans.git"
        assert subprocess.run(["git", "cat-file", "-e", fix], cwd=mirror).returncode == 0
        in_mirror = subprocess.run(
            "git cat-file --batch-all-objects --batch-check | wc -l", shell=True, cwd=mirror, capture_output=True, text=True
        ).stdout
        assert 0 < int(objects) < int(in_mirror)


async def test_capture_diff_new_deleted_committed_and_excluded(demo, runtime, new_sandbox) -> None:
    task = demo["demo-slugs"]
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        ws = await prepare_workspace(sb, task, runtime)
        assert (await capture_diff(sb, ws)).empty
        # What an agent might do: edit, add, delete, commit part of it, leave harness files around.
        await sb.write_file(f"{ws.workdir}/gold.patch", task.gold_patch)
        await sh(sb, "git apply gold.patch && rm gold.patch && git commit -qam fix", ws.workdir)
        await sh(sb, "echo new > notes.txt && git rm -q pyproject.toml && mkdir -p .claude && echo '{}' > .claude/settings.json", ws.workdir)
        await sh(sb, "echo 'farm wrote me' > CLAUDE.md && mkdir -p __pycache__ && echo x > __pycache__/junk.pyc", ws.workdir)
        diff = await capture_diff(sb, ws, exclude=["CLAUDE.md", ".claude/**"])
        assert sorted(diff.files) == ["notes.txt", "pyproject.toml", "slugs.py"]
        assert "CLAUDE.md" not in diff.patch and "settings.json" not in diff.patch and "junk.pyc" not in diff.patch
        assert "+++ b/notes.txt" in diff.patch and "deleted file mode" in diff.patch
        assert 'r"[^a-z0-9]+"' in diff.patch and not diff.too_large and diff.bytes == len(diff.patch.encode())
        # The repo's own index and HEAD were not disturbed by the capture.
        assert "notes.txt" in await sh(sb, "git status --porcelain", ws.workdir)
        small = await capture_diff(sb, ws, exclude=["CLAUDE.md", ".claude/**"], max_bytes=200)
        assert small.too_large and small.bytes == diff.bytes and len(small.patch) <= diff.bytes
        assert small.files == diff.files  # git's own list for a diff not read whole, the headers' for one read
        # without a .gitignore, what a test run leaves (bytecode, runner caches) is still not the agent's work
        await sh(sb, "git rm -q .gitignore && mkdir -p tests/__pycache__ .pytest_cache/v x.egg-info && "
                     "echo b > tests/__pycache__/t.cpython-311-pytest-8.pyc && echo {} > .pytest_cache/v/lastfailed && "
                     "echo m > x.egg-info/PKG-INFO && echo c > .coverage", ws.workdir)  # fmt: skip
        bare = await capture_diff(sb, ws, exclude=["CLAUDE.md", ".claude/**"])
        assert sorted(bare.files) == [".gitignore", "notes.txt", "pyproject.toml", "slugs.py"], bare.files
        # a diff's paths are its headers': odd names (quoted by git, " b/" inside one), a mode
        # change alone, a symlink, an empty file, bytes: the same list as git's own
        await sh(sb, "printf 'x' > 'a b/c b/d' 2>/dev/null || { mkdir -p 'a b/c b' && printf x > 'a b/c b/d'; }; "
                     "printf y > \"$(printf 'tab\\there')\" && printf z > 'quo\"te' && printf w > 'caf\u00e9.txt' && "
                     "ln -s slugs.py link && : > empty && printf '\\0\\1' > blob.bin && chmod +x tests/test_slugs.py", ws.workdir)
        odd = await capture_diff(sb, ws, exclude=["CLAUDE.md", ".claude/**"])
        git_says = await sh(sb, f"GIT_INDEX_FILE={ws.scratch}/capture.index git diff --cached --name-only --no-renames -z "
                                f"{ws.baseline_commit}", ws.workdir)  # fmt: skip
        assert odd.files == [p for p in git_says.split("\0") if p] and len(odd.files) == len(bare.files) + 8, odd.files


async def test_capture_sees_every_change_whatever_the_repos_own_index_says(demo, runtime, new_sandbox) -> None:
    """The capture starts from the repo's own index (its stat data spares hashing unchanged
    files): a same-size edit in the same tick as that index, a file flagged assume-unchanged
    or skip-worktree, and an index made unreadable must all still be in the diff."""
    task = demo["demo-slugs"]
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        ws = await prepare_workspace(sb, task, runtime)
        # racy: the file touched and its stat recorded in the index, then changed in the same
        # second, its size kept
        await sh(sb, "touch slugs.py && git update-index --refresh -q; sed -i 's/import re/import X/' slugs.py",
                 ws.workdir)  # fmt: skip
        assert (await capture_diff(sb, ws)).files == ["slugs.py"]
        await sh(sb, "git checkout -q -- slugs.py && git update-index --assume-unchanged slugs.py && "
                     "echo '# edited' >> slugs.py && git update-index --skip-worktree pyproject.toml && "
                     "echo '# edited' >> pyproject.toml", ws.workdir)  # fmt: skip
        assert (await capture_diff(sb, ws)).files == ["pyproject.toml", "slugs.py"]
        await sh(sb, "echo junk > .git/index", ws.workdir)
        assert (await capture_diff(sb, ws)).files == ["pyproject.toml", "slugs.py"]
        # a rollout leaves the scratch dir to the capture (prepare_workspace(make_scratch=False))
        await sh(sb, f"rm -rf {ws.scratch}", sb.root)
        assert (await capture_diff(sb, ws)).files == ["pyproject.toml", "slugs.py"]
        # a gitfile (a worktree, a separate git dir): its index is found by git, not at .git/index
        await sh(sb, "mv .git ../sep.git && echo 'gitdir: ../sep.git' > .git && rm ../sep.git/index && git reset -q && "
                     "git checkout -q -- slugs.py", ws.workdir)
        assert (await capture_diff(sb, ws)).files == ["pyproject.toml"]


async def test_capture_fails_cleanly_when_the_repo_is_gone(demo, runtime, new_sandbox) -> None:
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        ws = await prepare_workspace(sb, demo["demo-lrucache"], runtime)
        await sh(sb, "rm -rf .git", ws.workdir)
        with pytest.raises(PatchApplyError, match="cannot capture"):
            await capture_diff(sb, ws)


async def test_setup_failure_is_recorded_step_by_step(demo, runtime, new_sandbox) -> None:
    task = demo["demo-intervals"].model_copy(
        update={"setup_commands": ["echo one", "echo boom >&2; exit 3", "echo never"]}
    )
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        with pytest.raises(SetupCommandFailed) as info:
            await prepare_workspace(sb, task, runtime)
        report = info.value.report
        assert not report.ok and len(report.steps) == 2
        assert report.steps[0].ok and report.steps[0].stdout_tail.strip() == "one"
        assert report.steps[1].exit_code == 3 and "boom" in report.steps[1].stderr_tail
        assert "setup command 2/3" in str(info.value) and "exited 3" in str(info.value)
        ws = await prepare_workspace(sb, task.model_copy(update={"workdir": "again"}), runtime, raise_on_setup_failure=False)
        assert not ws.setup.ok and ws.setup.steps[1].exit_code == 3


async def test_setup_timeout_and_the_python_on_path(demo, runtime, new_sandbox) -> None:
    # Two runs, so that the python step keeps the default timeout: on a loaded machine importing pytest
    # alone can take longer than the short timeout the second run tests (a CI run failed that way).
    task = demo["demo-intervals"].model_copy(
        update={"setup_commands": ["python -c 'import pytest, sys; print(sys.prefix)'"]}
    )
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        ws = await prepare_workspace(sb, task, runtime)
        (only,) = ws.setup.steps
        assert only.ok and only.stdout_tail.strip()  # the configured python (with pytest) is first on PATH
        slow = task.model_copy(
            update={"workdir": "again", "setup_commands": ["true", "sleep 30"], "timeouts": TaskTimeouts(setup_s=1.5)}
        )
        with pytest.raises(SetupCommandFailed) as info:
            await prepare_workspace(sb, slow, runtime)
        first, second = info.value.report.steps
        assert first.ok
        assert second.timed_out and second.exit_code is None and "timed out" in str(info.value)


async def test_setup_output_is_part_of_the_baseline(demo, runtime, new_sandbox) -> None:
    """(Without environment snapshots, a task's base setup runs first, in its own checkout.)"""
    task = demo["demo-generic-sum"].model_copy(update={"base_setup_commands": ["echo 'base first' > base.txt"]})
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        ws = await prepare_workspace(sb, task, runtime)
        assert ws.baseline_commit != ws.base_commit and ws.setup.ok and len(ws.setup.steps) == 2
        assert await sb.read_file(f"{ws.workdir}/base.txt") == b"base first\n"
        assert (await capture_diff(sb, ws)).empty  # numbers.txt came from setup, not from the agent
        await sh(sb, "echo 5050 > total.txt", ws.workdir)
        diff = await capture_diff(sb, ws)
        assert diff.files == ["total.txt"]


async def test_missing_repo_and_commit_are_task_errors(tmp_path: Path, runtime, new_sandbox) -> None:
    missing = Task(id="m", instruction="x", workspace=GitSource(repo="nobody/nothing", base_commit="a" * 40))
    cache = RepoCache(cache_dir=tmp_path / "c", mirror_dirs=runtime.repos.mirror_dirs, fetch=False)
    with pytest.raises(RepositoryNotFound, match="repository nobody/nothing not found.*fetching is off"):
        await cache.workspace_tarball(missing.workspace)
    bad_commit = GitSource(repo="acme/romans", base_commit="f" * 40)
    with pytest.raises(CommitNotFound, match=f"base commit {'f' * 40} not found"):
        await cache.workspace_tarball(bad_commit)
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        rt = type(runtime)(config=runtime.config, repos=cache, path_prefix=runtime.path_prefix)
        with pytest.raises(TaskError, match="nobody/nothing"):
            await prepare_workspace(sb, missing, rt)


async def test_a_failed_clone_is_tried_once_for_the_tasks_waiting_on_it(tmp_path: Path, monkeypatch) -> None:
    """With tasks.fetch on, rollouts asking together for a repository no mirror holds wait for
    one clone: when it fails, those that waited get its error instead of cloning again (a later
    ask tries again: a clone failure is not known to last)."""
    import farm.tasks.repos as repos

    clones = []
    real_run = repos.run_host

    async def counted(argv, **kw):  # the real git, counted
        if "clone" in argv:
            clones.append(argv)
        return await real_run(argv, **kw)

    monkeypatch.setattr(repos, "run_host", counted)
    cache = RepoCache(cache_dir=tmp_path / "c", fetch=True)
    source = GitSource(repo="getmoto/moto", url="http://127.0.0.1:9/moto.git", base_commit="a" * 40)
    errors = await asyncio.gather(*(cache.locate(source) for _ in range(3)), return_exceptions=True)
    assert len(clones) == 1 and all(isinstance(e, TaskError) and not e.deterministic for e in errors), errors
    assert {str(e) for e in errors} == {str(errors[0])} and "cloning http://127.0.0.1:9/moto.git failed" in str(errors[0])
    with pytest.raises(TaskError, match="cloning"):
        await cache.locate(source)
    assert len(clones) == 2


async def test_repo_from_local_url_tarball_source_and_pre_patch(tmp_path: Path, runtime, new_sandbox) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("value = 1\n")
    subprocess.run("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm one", shell=True, cwd=src, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True).stdout.strip()
    bump = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-value = 1\n+value = 2\n"
    cache = RepoCache(cache_dir=tmp_path / "cache", fetch=False)
    rt = type(runtime)(config=runtime.config, repos=cache, path_prefix=runtime.path_prefix)
    by_url = Task(id="u", instruction="x", workspace=GitSource(url=str(src), base_commit=head[:10]), pre_patch=bump)
    tar = tmp_path / "ws.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(src / "a.py", arcname="a.py")
    from_tar = Task(id="t", instruction="x", workspace=TarballSource(path=str(tar)), workdir="w")
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        ws = await prepare_workspace(sb, by_url, rt)
        assert (await sh(sb, "cat a.py", ws.workdir)) == "value = 2\n"
        # The pre-patched base is one parentless commit: the original is unreachable and pruned.
        assert (await sh(sb, "git rev-list --count HEAD", ws.workdir)).strip() == "1"
        assert (await sb.exec(f"git cat-file -e {head}", cwd=ws.workdir, timeout=60)).exit_code != 0
        ws2 = await prepare_workspace(sb, from_tar, rt)
        assert ws2.workdir == f"{sb.root}/w" and (await sh(sb, "git status --porcelain", ws2.workdir)) == ""
        assert (await sh(sb, "git show HEAD:a.py", ws2.workdir)) == "value = 1\n"


async def test_one_tarball_build_for_many_parallel_rollouts(tmp_path: Path, runtime) -> None:
    cache = RepoCache(cache_dir=tmp_path / "cache", mirror_dirs=runtime.repos.mirror_dirs, fetch=False)
    src = GitSource(repo="acme/wordfreq", base_commit="HEAD~1")
    paths = await asyncio.gather(*(cache.workspace_tarball(src) for _ in range(16)))
    assert len(set(paths)) == 1 and paths[0].is_file()
    built = list((tmp_path / "cache" / "workspaces").rglob("*.tar"))
    assert built == [paths[0]]
    assert not list((tmp_path / "cache" / "tmp").iterdir())
