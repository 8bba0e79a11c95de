"""Layered environments with real sandboxes: one base per repository-version (the venv),
a thin instance layer per base commit on top, stacked as a sandbox's lower layers.

The repository is made here: three commits of a tiny package (c3, the newest, is the
rows' environment_setup_commit). Base setup makes a real venv with uv (no network);
instance setup installs the checkout into it as an editable path (a .pth file) and
removes a file of the base (a deletion the layer must carry)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from farm.cli import main
from farm.envs.config import EnvsConfig
from farm.envs.identity import identity_of
from farm.envs.layers import keep_untracked, seal_layer
from farm.envs.provider import EnvBuildFailed, EnvProvider
from farm.errors import SandboxError, TaskError
from farm.grading.validate import solution_diff, validate_task
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.views import ViewLayer, mount_view, mounts_under, unmount_under
from farm.tasks.config import TasksConfig
from farm.tasks.model import GitSource, Task
from farm.tasks.pycache import REPO_COMPILE_LABEL, SNAPSHOT_WARM_LABEL, WARMED_MARKER
from farm.tasks.runtime import TaskRuntime
from farm.workspace.prepare import prepare_workspace

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
BASE_SETUP = [
    "uv venv -q .venv",  # (uv puts a .gitignore of '*' in it: git ignores the venv by itself)
    "echo base-only > .venv/stale.txt",
    "git rev-parse HEAD > .venv/built-at",
    "echo compiled > pkg/_speedups.so",  # an untracked build product beside tracked sources
]
SETUP = [
    'echo "$PWD" > "$(echo .venv/lib/python*/site-packages)/pkg.pth"',  # the editable install of this checkout
    "rm .venv/stale.txt",
]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, str]:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    commits = []
    for i in (1, 2, 3):
        (work / "pkg" / "__init__.py").write_text(f"VERSION = {i}\n")
        git(work, "add", "-A")
        git(work, "commit", "-qm", f"c{i}")
        commits.append(git(work, "rev-parse", "HEAD"))
    mirrors = tmp_path / "mirrors"
    mirrors.mkdir()
    git(tmp_path, "clone", "-q", "--bare", str(work), str(mirrors / "o__pkg.git"))
    return {"mirrors": str(mirrors), "c1": commits[0], "c2": commits[1], "c3": commits[2]}


def instance(repo: dict, commit: str, tid: str, base_setup: list[str] | None = None, **kw) -> Task:
    return Task(id=tid, instruction="fix it", workspace=GitSource(repo="o/pkg", base_commit=repo[commit]),
                base_setup_commands=BASE_SETUP if base_setup is None else base_setup, setup_commands=SETUP,
                metadata={"version": "1", "environment_setup_commit": repo["c3"]}, verify_commands=["true"],
                **kw)  # fmt: skip


@pytest.fixture
def world(tmp_path: Path, repo):
    sb = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb"), setup_network="isolated"))
    envs = EnvsConfig(cache_dir=str(tmp_path / "envs"))

    def provider(make=None) -> EnvProvider:
        runtime = TaskRuntime.from_config(TasksConfig(path=str(tmp_path / "tasks.jsonl"), cache_dir=str(tmp_path / "tc"),
                                                      mirror_dir=repo["mirrors"]))  # (not the demo set: no build of it)
        p = EnvProvider(envs, runtime, make or (lambda spec: create_sandbox(sb, spec)), labels={"run_id": "layers"})
        runtime.envs = p
        return p

    return {"sb": sb, "provider": provider, "tmp": tmp_path}


def listing(tree: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``tree`` with its size and mtime (to see that nothing wrote there)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), tree)] = (st.st_size, st.st_mtime_ns)
    return out


SWESMITH_BUG = "--- a/pkg/__init__.py\n+++ b/pkg/__init__.py\n@@ -1 +1 @@\n-VERSION = 3\n+VERSION = 30\n"


async def test_an_instance_compiles_what_its_setup_added_to_the_bases_venv(world, repo):
    """The base's build compiled its venv (and marked it); an instance whose setup installs
    into that venv gets the bytecode of what it added in its own layer, not the base's again."""
    p = world["provider"]()
    site = '"$(echo .venv/lib/python*/site-packages)"'
    t = instance(repo, "c1", "i1", base_setup=[*BASE_SETUP, f"echo 'B = 1' > {site}/base_mod.py"])
    t = t.model_copy(update={"setup_commands": [*SETUP, f"echo 'Z = 1' > {site}/inst_mod.py"]})
    ident = await p.identity(t)
    await p.view_for(t)
    base_tree, tree = p.store.tree(ident.base.key), p.store.tree(ident.key)
    assert (base_tree / ".venv" / WARMED_MARKER).exists()
    assert list(base_tree.glob(".venv/lib/python*/site-packages/__pycache__/base_mod.*.pyc"))  # the base's own
    layer = sorted(str(f.relative_to(tree)) for f in tree.rglob("*.pyc"))
    assert [f for f in layer if "/site-packages/" in f] == [
        next(f for f in layer if f.endswith(f"inst_mod.cpython-{sys.version_info[0]}{sys.version_info[1]}.pyc"))], layer


@pytest.mark.slow
async def test_two_instances_share_one_base(world, repo, caplog):
    """A SWE-bench-shaped instance (base commit c1, environment_setup_commit c3) and a
    SWE-smith-shaped one (the repository's head, c3, with its bug as a pre-patch) share
    the base built at c3; each sees its own commit and no later history."""
    caplog.set_level(logging.INFO, logger="farm.workspace.prepare")
    p = world["provider"]()
    t1 = instance(repo, "c1", "i1")
    t2 = Task(id="i2", instruction="fix it", workspace=GitSource(repo="o/pkg", base_commit="HEAD"),
              pre_patch=SWESMITH_BUG, base_setup_commands=BASE_SETUP, setup_commands=SETUP, verify_commands=["true"])  # fmt: skip
    id1, id2 = await p.identity(t1), await p.identity(t2)
    assert id1.base.key == id2.base.key and id1.key != id2.key
    await asyncio.gather(p.view_for(t1), p.view_for(t2))
    assert sorted(p.built) == sorted([id1.base.key, id1.key, id2.key])  # the base once, an instance each
    # the venv's caches written by the base's build only, the repository's by each instance's
    # (an instance's setup added no source to it: nothing compiled again, no collection)
    warmed = [r.getMessage() for r in caplog.records if "farm: the" in r.getMessage()]
    assert sum(SNAPSHOT_WARM_LABEL in m and "./.venv" in m for m in warmed) == 1, warmed
    assert sum(REPO_COMPILE_LABEL in m for m in warmed) == 2, warmed
    assert p.store.record(id1.key).deleted == [".venv/stale.txt"]
    base_tree = p.store.tree(id1.base.key)
    base = p.store.record(id1.base.key)
    assert base.kind == "base" and base.paths == [".venv/", "pkg/_speedups.so"]
    assert sorted(os.listdir(base_tree)) == [".venv", "pkg"]  # no .git, no tracked file of the setup commit
    assert os.listdir(base_tree / "pkg") == ["_speedups.so"]
    assert (base_tree / ".venv" / "built-at").read_text().strip() == repo["c3"]  # built at environment_setup_commit
    before = listing(base_tree)
    for t, version, history in ((t1, "1", ["c1"]), (t2, "30", ["task base"])):
        spec = await p.runtime.sandbox_spec(t, SandboxSpec(labels={"run_id": "layers"}))
        assert [layer.path for layer in spec.view.layers] == [str(p.store.tree(spec.view.key)), str(base_tree)]
        sb = await create_sandbox(world["sb"], spec)
        try:
            ws = await prepare_workspace(sb, t, p.runtime)
            assert ws.setup.ok and len(ws.setup.steps) == len(BASE_SETUP + SETUP)
            assert (ws.base_commit == repo["c1"]) is (t is t1)
            r = await sb.exec("git log --format=%s; git status --porcelain", cwd=ws.workdir)
            assert r.stdout.splitlines() == history, r  # its own history, a clean status: the venv is not a diff
            r = await sb.exec("ls -a .venv; .venv/bin/python -c 'import pkg; print(pkg.VERSION)'", cwd=ws.workdir)
            assert "built-at" in r.stdout and "stale.txt" not in r.stdout  # the base's venv, less the deletion
            assert r.ok and r.stdout.split()[-1] == version, r  # the venv imports this instance's checkout
            for later in ("c2", "c3"):
                r = await sb.exec(f"git cat-file -e {repo[later]}", cwd=ws.workdir)
                assert r.exit_code != 0  # no later history (SWE-smith: not even its own base commit)
            r = await sb.exec("echo mine > pkg/new.py && echo x >> .venv/built-at", cwd=ws.workdir)
            assert r.ok
            assert (sb.dir / "view" / "upper" / "pkg" / "new.py").read_text() == "mine\n"  # the rollout's upper
            assert not (p.store.tree(spec.view.key) / "pkg" / "new.py").exists()
        finally:
            await sb.close()
    # grading: the solution's diff from a layered view holds the edit, never the venv; the
    # fresh grading sandboxes (the same views) run the checkout through the base's venv
    v = t1.model_copy(update={
        "solution_commands": ["echo 'VERSION = 10' > pkg/__init__.py && echo more >> .venv/built-at"],
        "verify_commands": [".venv/bin/python -c 'import pkg; assert pkg.VERSION == 10, pkg.VERSION'"]})  # fmt: skip
    labels = {"run_id": "layers"}

    def new_sandbox(spec: SandboxSpec):
        return create_sandbox(world["sb"], spec)

    diff = await solution_diff(v, runtime=p.runtime, new_sandbox=new_sandbox, labels=labels)
    assert "+VERSION = 10" in diff and ".venv" not in diff and "_speedups" not in diff
    result = await validate_task(v, runtime=p.runtime, new_sandbox=new_sandbox, labels=labels)
    assert result.valid and result.gold.reward == 1.0 and result.empty.reward == 0.0, result.reason
    assert len(p.built) == 3  # nothing built again
    assert listing(base_tree) == before  # never written, by builds, rollouts or gradings
    assert not mounts_under(world["tmp"] / "sb")


# --- a layer from each kind of build, stacked in each kind of view (host only, no sandbox) ---------


def snapshot_of(tree: Path) -> dict[str, str]:
    """What a view shows: each path's kind and content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, tree)
            if os.path.islink(path):
                out[rel] = "-> " + os.readlink(path)
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                out[rel] = Path(path).read_text()
    return out


def plain(tree: Path) -> bool:
    """No whiteout, opaque marker or overlay xattr left: farm's layer format."""
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISCHR(st.st_mode) or name.startswith(".wh."):
                return False
            if not os.path.islink(path) and any("overlay" in a for a in os.listxattr(path)):
                return False
    return True


@pytest.mark.parametrize("build_mode", ["overlay", "fuse-overlayfs", "copy"])
def test_a_layer_stacks_the_same_in_every_view(tmp_path, build_mode):
    """An instance build's writes (new, changed and deleted files, a directory replaced
    whole, a file replaced by a directory) sealed into a plain layer show exactly what the
    build saw, in an overlay, a fuse-overlayfs and a copy view; the layers stay unwritten."""
    base = tmp_path / "base"
    for rel, text in {"venv/lib/a.py": "a", "venv/lib/b.py": "b", "venv/pkg/x.py": "x", "venv/pkg/y.py": "y",
                      "venv/gone/z.py": "z", "venv/f": "file"}.items():  # fmt: skip
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    os.symlink("lib", base / "venv" / "lib64")
    tree = tmp_path / "build" / "tree"
    merged = mount_view([ViewLayer(path=str(base))], tmp_path / "bview", build_mode, upper=tree)
    (merged / "venv" / "lib" / "a.py").write_text("a, changed")
    (merged / "venv" / "lib" / "new.py").write_text("new")
    (merged / "venv" / "lib" / "b.py").unlink()
    shutil.rmtree(merged / "venv" / "pkg")  # pip uninstall, then install another version
    (merged / "venv" / "pkg").mkdir()
    (merged / "venv" / "pkg" / "x.py").write_text("x2")
    shutil.rmtree(merged / "venv" / "gone")
    (merged / "venv" / "f").unlink()
    (merged / "venv" / "f").mkdir()
    (merged / "venv" / "f" / "inside").write_text("i")
    (merged / "src").mkdir()
    (merged / "src" / "m.py").write_text("checkout")
    expected = snapshot_of(merged)
    unmount_under(tmp_path / "bview")
    before = snapshot_of(base)
    deleted = seal_layer(tree, build_mode, base)
    replaced = "venv/pkg/y.py" if build_mode == "copy" else "venv/pkg"  # a copy cannot tell: the same view
    assert deleted == ["venv/f", "venv/gone", "venv/lib/b.py", replaced] and plain(tree)
    assert not (tree / "venv" / "lib" / "lib64").exists() and "venv/lib64" not in snapshot_of(tree)  # unchanged: not copied
    layers = [ViewLayer(path=str(tree), deleted=tuple(deleted)), ViewLayer(path=str(base))]
    for view_mode in ("overlay", "fuse-overlayfs", "copy"):
        view = mount_view(layers, tmp_path / f"view-{view_mode}", view_mode)
        try:
            assert snapshot_of(view) == expected, view_mode
            (view / "venv" / "lib" / "a.py").write_text("a rollout's write")
            (view / "venv" / "lib" / "new.py").unlink()
        finally:
            unmount_under(tmp_path / f"view-{view_mode}")
    assert snapshot_of(base) == before and (tree / "venv" / "lib" / "new.py").read_text() == "new"


def test_keep_untracked_takes_only_what_setup_made(tmp_path):
    checkout, dest = tmp_path / "co", tmp_path / "tree"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "src" / "pkg.egg-info").mkdir(parents=True)
    (checkout / "src" / "tracked.py").write_text("t")
    (checkout / ".venv" / "bin").mkdir(parents=True)
    dest.mkdir()
    keep_untracked(checkout, [".venv/", "src/pkg.egg-info/"], dest)
    assert sorted(snapshot_of(dest)) == [".venv", ".venv/bin", "src", "src/pkg.egg-info"] and not checkout.exists()
    (tmp_path / "co2" / "link").parent.mkdir()
    os.symlink("/etc", tmp_path / "co2" / "link")
    with pytest.raises(TaskError, match="not a directory"):
        keep_untracked(tmp_path / "co2", ["link/passwd"], tmp_path / "tree2")
    with pytest.raises(TaskError, match="refusing"):
        keep_untracked(tmp_path / "co2", [".git/config"], tmp_path / "tree2")


# --- identity, failures, the cache ---------------------------------------------------------------


async def test_identity_one_base_per_repository_version(world, repo):
    p = world["provider"]()
    i1, i2 = instance(repo, "c1", "i1"), instance(repo, "c2", "i2")
    a, b = await p.identity(i1), await p.identity(i2)
    assert a.base.key == b.base.key and a.key != b.key and a.fields["base"] == a.base.key
    assert a.base.fields["workspace"]["setup_commit"] == repo["c3"] and a.fields["setup_commands"] == SETUP

    async def ident(t: Task, **kw):
        return await identity_of(t, p.runtime, mount_root="/workspace", **kw)

    for name, t in {
        "recipe": i1.model_copy(update={"base_setup_commands": [*BASE_SETUP, "true"]}),
        "setup commit": i1.model_copy(update={"metadata": {"version": "1", "environment_setup_commit": repo["c2"]}}),
        "env": i1.model_copy(update={"env": {"X": "1"}}),
        "python": i1.model_copy(update={"python": "none"}),
    }.items():
        assert (await ident(t)).base.key != a.base.key, name
    for t in (i1.model_copy(update={"setup_commands": ["true"]}), i1.model_copy(update={"pre_patch": "x"}),
              i1.model_copy(update={"id": "other", "instruction": "other"})):  # fmt: skip
        other = await ident(t)
        assert other.base.key == a.base.key and (other.key == a.key) is (t.id == "other")
    # no environment_setup_commit: one base per version
    v1, v2, v3 = (t.model_copy(update={"metadata": {"version": v}}) for t, v in ((i1, "1"), (i2, "1"), (i1, "2")))
    k1, k2, k3 = [(await ident(t)).base.key for t in (v1, v2, v3)]
    assert k1 == k2 != k3 and k1 != a.base.key
    # E2B (not layered) and a task without base setup: one layer, base setup first
    flat = await ident(i1, layered=False)
    assert flat.base is None and flat.fields["setup_commands"] == BASE_SETUP + SETUP
    one = await ident(i1.model_copy(update={"base_setup_commands": []}))
    assert one.base is None and "base" not in one.fields and one.fields["setup_commands"] == SETUP


async def test_a_failing_base_fails_each_of_its_instances_once(world, repo):
    p = world["provider"]()
    bad = [instance(repo, c, f"b{c}", base_setup=["uv venv -q .venv", "echo broken-base >&2; exit 7"])
           for c in ("c1", "c2")]  # fmt: skip
    errors = await asyncio.gather(*[p.view_for(t) for t in bad * 2], return_exceptions=True)
    assert all(isinstance(e, EnvBuildFailed) for e in errors), errors
    assert "base environment" in str(errors[0]) and "broken-base" in str(errors[0]) and "exited 7" in str(errors[0])
    assert "base setup command 2/2" in str(errors[0]) and errors[0].report.steps[-1].exit_code == 7
    base_key = (await p.identity(bad[0])).base.key
    assert p.built == [base_key]  # built (and failed) once; no instance on it
    assert [(e.record.kind, e.record.ok) for e in p.store.entries()] == [("base", False)]
    again = world["provider"]()
    with pytest.raises(EnvBuildFailed, match="broken-base"):
        await again.view_for(bad[1])
    assert again.built == []
    # an instance whose own setup fails: recorded for it alone, the base and its siblings are fine
    good, broken = instance(repo, "c1", "g"), instance(repo, "c2", "x").model_copy(update={"setup_commands": ["exit 5"]})
    with pytest.raises(EnvBuildFailed, match="setup command 1/1 .exit 5. exited 5") as err:
        await p.view_for(broken)
    assert "base environment" not in str(err.value)
    assert (await p.view_for(good)).layers[1].path == str(p.store.tree((await p.identity(good)).base.key))


async def test_an_incomplete_mirror_names_the_commit_each_failure_is_about(world, tmp_path):
    """A mirror missing blobs (a snapshot without its big files): c2 adds big1.bin, c3 (the
    environment_setup_commit) adds big2.bin, neither blob is in the mirror. A row at c2
    fails naming its own base commit and big1.bin alone (not its base's commit); a row at c1,
    whose tree is whole, fails on its base, naming the environment_setup_commit."""
    work, mirrors = tmp_path / "w2", tmp_path / "m2"
    (work / "pkg").mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    commits, blobs = [], []
    for i in (1, 2, 3):
        if i > 1:
            (work / f"big{i - 1}.bin").write_bytes(os.urandom(2048))
        (work / "pkg" / "__init__.py").write_text(f"VERSION = {i}\n")
        git(work, "add", "-A")
        git(work, "commit", "-qm", f"c{i}")
        commits.append(git(work, "rev-parse", "HEAD"))
        if i > 1:
            blobs.append(git(work, "rev-parse", f"HEAD:big{i - 1}.bin"))
    git(tmp_path, "init", "-q", "--bare", str(mirrors / "o__pkg.git"))
    git(work, "push", "-q", str(mirrors / "o__pkg.git"), "main")  # loose objects: a blob can go
    for oid in blobs:
        (mirrors / "o__pkg.git" / "objects" / oid[:2] / oid[2:]).unlink()
    runtime = TaskRuntime.from_config(TasksConfig(path=str(tmp_path / "t.jsonl"), cache_dir=str(tmp_path / "tc2"),
                                                  mirror_dir=str(mirrors)))  # fmt: skip
    p = EnvProvider(EnvsConfig(cache_dir=str(tmp_path / "envs2")), runtime, lambda spec: create_sandbox(world["sb"], spec))
    runtime.envs = p
    repo = {"c1": commits[0], "c2": commits[1], "c3": commits[2]}
    with pytest.raises(TaskError) as own:
        await p.view_for(instance(repo, "c2", "at-c2"))
    msg = str(own.value)
    assert f"the tree of base commit {commits[1][:12]} is incomplete" in msg, msg
    assert f"big1.bin ({blobs[0][:12]})" in msg and "1 object(s) missing" in msg and "big2.bin" not in msg
    assert p.built == []  # nothing built for a row whose own tree is not there
    with pytest.raises(EnvBuildFailed) as base:
        await p.view_for(instance(repo, "c1", "at-c1"))
    msg = str(base.value)
    assert "base environment" in msg and "(the environment_setup_commit)" in msg, msg
    assert f"{commits[2][:12]} is incomplete" in msg and "2 object(s) missing" in msg and "big2.bin" in msg


async def test_an_infrastructure_failure_publishes_nothing(world, repo):
    calls = []

    async def flaky(spec: SandboxSpec):
        calls.append(spec.labels["purpose"])
        if len(calls) == 1:
            raise SandboxError("the sandbox backend is down")
        return await create_sandbox(world["sb"], spec)

    p = world["provider"](flaky)
    t = instance(repo, "c1", "i1")
    with pytest.raises(SandboxError):
        await p.view_for(t)
    assert p.store.entries() == [] and not list(p.store.root.glob(".build/*/tree"))
    view = await p.view_for(t)  # the next rollout builds
    assert len(view.layers) == 2 and calls == ["env-build"] * 3


async def test_a_base_stays_while_instances_need_it(world, repo, capsys):
    p = world["provider"]()
    t1, t2 = instance(repo, "c1", "i1"), instance(repo, "c2", "i2")
    await asyncio.gather(p.view_for(t1), p.view_for(t2))
    k1, k2, base = (await p.identity(t1)).key, (await p.identity(t2)).key, (await p.identity(t1)).base.key
    store = p.store
    assert store.blocker(base) == "the base of 2 instance environment(s)" and not store.remove(base)
    assert main(["envs", "ls", "--set", f"envs.cache_dir={store.root}"]) == 0
    out = capsys.readouterr().out
    assert f"{base[:12]}  base " in out and "base of 2 instance(s)" in out and f"{k1[:12]}  instance" in out
    assert out.count(f"on base {base[:12]}") == 2
    spec = await p.runtime.sandbox_spec(t1, SandboxSpec(labels={"run_id": "layers"}))
    sb = await create_sandbox(world["sb"], spec)  # t1's view: its layer and the base in use
    try:
        assert store.in_use(k1) and store.in_use(base) and not store.in_use(k2)
        assert store.gc(0) == [k2]
    finally:
        await sb.close()
    assert store.gc(0) == [k1, base]  # the instance first, then its base
    await p.view_for(t1)
    assert main(["envs", "rm", base[:8], "--set", f"envs.cache_dir={store.root}"]) == 1
    assert "the base of 1 instance environment(s)" in capsys.readouterr().err
    assert main(["envs", "rm", base[:8], "--force", "--set", f"envs.cache_dir={store.root}"]) == 0
    assert store.entries() == []



def test_envs_build_builds_each_base_once(tmp_path, repo, capsys):
    """`farm envs build` on a task file: a line per base and per instance; an instance of a
    failing base fails with it; `rm --failed` forgets that base alone."""
    bad = instance(repo, "c1", "bad", base_setup=["echo broken >&2; exit 3"])
    rows = [instance(repo, "c1", "i1"), instance(repo, "c2", "i2"), bad]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(t.model_dump_json() + "\n" for t in rows))
    sets = [f"tasks.mirror_dir={repo['mirrors']}", f"tasks.cache_dir={tmp_path / 'tc'}",
            f"envs.cache_dir={tmp_path / 'envs'}", f"sandbox.local.base_dir={tmp_path / 'sb'}"]  # fmt: skip
    args = [a for kv in sets for a in ("--set", kv)]
    assert main(["envs", "build", str(tasks), "--concurrency", "3", *args]) == 1  # the failing base
    out = capsys.readouterr().out.splitlines()
    bases = [ln for ln in out if "  base  " in ln]
    assert len(bases) == 2 and sum("built" in ln for ln in bases) == 1 and sum("FAILED" in ln for ln in bases) == 1
    instances = [ln for ln in out if "  instance  " in ln]
    assert sum(" built " in ln and "on base" in ln for ln in instances) == 2
    assert [ln for ln in instances if "FAILED  its base" in ln] == [ln for ln in instances if "(bad)" in ln] != []
    assert out[-1].startswith("envs build: 3 environment(s) on 2 base(s) for 3 task(s), 2 failed")
    assert main(["envs", "rm", "--failed", *args]) == 0
    assert main(["envs", "ls", *args]) == 0
    listed = capsys.readouterr().out
    assert "FAILED" not in listed and listed.count(" instance ") == 2 and "base of 2 instance(s)" in listed
