"""Images in the layouts of SWE-bench, SWE-Gym, SWE-smith and SWE-rebench, holding farm's demo
repositories, with the rows that name them (for the tests and ``scripts/bench_images.py``).

Every image is three layers, as SWE-bench's are (base, environment, instance):

1. a Debian root file system with bash, git, coreutils and Python 3 with pytest
   (``testkit.rootfs``: the host's own packages; shared by every image);
2. ``/opt/miniconda3``: an ``activate`` script and a ``testbed`` environment in conda's layout
   (a Python venv: conda itself cannot be installed here, no network but PyPI), so that the
   datasets' documented activation, ``source /opt/miniconda3/bin/activate && conda activate
   testbed``, leaves ``CONDA_PREFIX``/``CONDA_DEFAULT_ENV`` and its ``bin`` first on PATH,
   as conda's does; ``~/.bashrc`` activates it as SWE-bench's images do (shared);
3. ``/testbed``: the task's repository (per instance): SWE-bench's and its kin at the row's
   base commit (only history up to it); SWE-smith's at the repository's clean commit (its
   rows' ``patch`` introduces the bug).

The base layers are built once per machine and cached (``cache_dir``): the suite and the
benchmark pay for them once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testkit.oci import Blob, OciLayout, push, tar_of_tree

PACKAGES = ["bash", "dash", "coreutils", "git", "grep", "sed", "findutils", "diffutils", "patch", "procps", "python3",
            "python3-pytest"]  # fmt: skip
ACTIVATE = """# farm's stand-in for miniconda's bin/activate (sourced): conda's shell function, and `base` activated
_farm_conda_root=/opt/miniconda3
conda() {
  case "$1" in
    activate)
      local env="${2:-base}" prefix
      if [ "$env" = base ]; then prefix="$_farm_conda_root"; else prefix="$_farm_conda_root/envs/$env"; fi
      [ -d "$prefix" ] || { echo "EnvironmentNameNotFound: Could not find conda environment: $env" >&2; return 1; }
      [ -n "${CONDA_PREFIX:-}" ] && PATH="${PATH//$CONDA_PREFIX\\/bin:/}"
      export CONDA_PREFIX="$prefix" CONDA_DEFAULT_ENV="$env" CONDA_SHLVL=1 CONDA_PROMPT_MODIFIER="($env) "
      export PATH="$prefix/bin:$PATH" ;;
    *) echo "conda $1: not available in this image (farm's stand-in knows activate only)" >&2; return 1 ;;
  esac
}
export CONDA_EXE="$_farm_conda_root/bin/conda"
conda activate base
"""
BASHRC = "source /opt/miniconda3/bin/activate\nconda activate testbed\n"


def _cache_key() -> str:
    status = Path("/var/lib/dpkg/status")
    stamp = f"{status.stat().st_mtime_ns}" if status.exists() else "nodpkg"
    return hashlib.sha256(json.dumps([PACKAGES, ACTIVATE, BASHRC, stamp, 2]).encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path(os.path.expanduser("~/.cache/farm/test-images"))


@dataclass
class BaseLayers:
    """The shared layers, in an OCI layout directory of their own (copied into others)."""

    rootfs: Blob
    conda: Blob
    root: Path  # the layout holding their blobs

    def into(self, layout: OciLayout) -> list[Blob]:
        for blob in (self.rootfs, self.conda):
            dest = layout.blob_path(blob.digest)
            if not dest.exists():
                try:
                    os.link(OciLayout(self.root).blob_path(blob.digest), dest)
                except OSError:
                    shutil.copy2(OciLayout(self.root).blob_path(blob.digest), dest)
        return [self.rootfs, self.conda]


def base_layers(cache_dir: Path | None = None) -> BaseLayers:
    """The Debian and conda-layout layers, built once per machine (under a lock)."""
    from testkit.rootfs import debian_rootfs

    root = (cache_dir or default_cache_dir()) / _cache_key()
    done = root / "layers.json"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            data = json.loads(done.read_text())
            return BaseLayers(rootfs=Blob(**data["rootfs"]), conda=Blob(**data["conda"]), root=root)
        layout = OciLayout(root)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            fs = Path(tmp) / "rootfs"
            debian_rootfs(fs, PACKAGES)
            rootfs = layout.add_layer(tar_of_tree(fs))
            conda = Path(tmp) / "conda"
            env = conda / "opt/miniconda3/envs/testbed"
            (conda / "opt/miniconda3/bin").mkdir(parents=True)
            (conda / "opt/miniconda3/bin/activate").write_text(ACTIVATE)
            (env / "bin").mkdir(parents=True)
            (env / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\nversion = 3.11\n")
            for name in ("python", "python3"):
                (env / "bin" / name).symlink_to("/usr/bin/python3")
            pytest_bin = env / "bin/pytest"
            pytest_bin.write_text("#!/opt/miniconda3/envs/testbed/bin/python\nimport sys\nfrom pytest import console_main\n"
                                  "sys.exit(console_main())\n")  # fmt: skip
            pytest_bin.chmod(0o755)
            (conda / "root").mkdir(mode=0o700)
            (conda / "root/.bashrc").write_text(BASHRC)
            conda_blob = layout.add_layer(tar_of_tree(conda))
        done.write_text(json.dumps({"rootfs": rootfs.__dict__, "conda": conda_blob.__dict__}))
        return BaseLayers(rootfs=rootfs, conda=conda_blob, root=root)


def testbed_tree(dest: Path, mirror: Path, commit: str) -> None:
    """``dest/testbed``: ``mirror``'s repository at ``commit``, with its history up to it only."""
    repo = dest / "testbed"
    repo.mkdir(parents=True)
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env, timeout=120)

    git("init", "-q", "-b", "main")
    git("fetch", "-q", "--no-tags", str(mirror), commit)
    git("checkout", "-q", "-B", "main", "FETCH_HEAD")
    for sample in (repo / ".git" / "hooks").glob("*.sample"):
        sample.unlink()


def testbed_layer(layout: OciLayout, mirror: Path, commit: str) -> Blob:
    with tempfile.TemporaryDirectory() as tmp:
        testbed_tree(Path(tmp), mirror, commit)
        return layout.add_layer(tar_of_tree(Path(tmp)))


def push_image(layout: OciLayout, base: BaseLayers, mirror: Path, commit: str, dest: str) -> None:
    """An instance image (base, conda layout, ``/testbed`` at ``commit``) pushed to ``dest``."""
    tag = hashlib.sha256(dest.encode()).hexdigest()[:12]
    layers = [*base.into(layout), testbed_layer(layout, mirror, commit)]
    layout.add_image(tag, layers, env=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                       "LANG=C.UTF-8"], workdir="/testbed", cmd=["/bin/bash"])  # fmt: skip
    push(layout, tag, dest)


def head_of(mirror: Path) -> str:
    return subprocess.run(["git", "-C", str(mirror), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


# --- rows as each dataset ships them --------------------------------------------------------
EVAL_SCRIPT = """#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff {base}
source /opt/miniconda3/bin/activate
conda activate testbed
git checkout {base} {files}
git apply -v - <<'EOF_114329324912'
{test_patch}
EOF_114329324912
: '>>>>> Start Test Output'
{test_cmd}
: '>>>>> End Test Output'
git checkout {base} {files}
"""


def _id(row: dict) -> str:
    return row["id"]


def swebench_row(demo: dict, *, image: str | None = None, eval_script: bool = False, image_field: str = "image_name") -> dict:
    """A demo task as SWE-bench ships a row (the image named in ``image_field`` when given;
    ``eval_script``: the row carries its harness's script, as SWE-bench's newer exports do)."""
    from farm.tasks.formats import test_files_of_patch

    base = demo["workspace"]["base_commit"]
    files = set(test_files_of_patch(demo["test_patch"]))
    p2p = [t for t in demo.get("pass_to_pass", []) if t.split("::")[0] in files]  # SWE-bench runs those files only
    row = {
        "instance_id": demo["id"], "repo": demo["workspace"]["repo"], "base_commit": base,
        "problem_statement": demo["instruction"], "patch": demo["gold_patch"], "test_patch": demo["test_patch"],
        "FAIL_TO_PASS": json.dumps(demo["fail_to_pass"]), "PASS_TO_PASS": json.dumps(p2p),
        "version": "0.1", "environment_setup_commit": base, "created_at": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    if image:
        row[image_field] = image
    if eval_script:
        files = " ".join(test_files_of_patch(demo["test_patch"]))
        row["eval_script"] = EVAL_SCRIPT.format(base=base, files=files, test_patch=demo["test_patch"].rstrip("\n"),
                                                test_cmd=f"pytest -rA -p no:cacheprovider {files}")  # fmt: skip
    return row


def swesmith_row(demo: dict, image: str) -> dict:
    """SWE-smith's: the image holds the repository at its clean commit; ``patch`` introduces the bug."""
    from farm.tasks.patches import reverse_patch

    commit = demo["metadata"]["fix_commit"]
    owner, name = demo["workspace"]["repo"].split("/")
    return {
        "instance_id": f"{owner}__{name}.{commit[:8]}.demo__{demo['id']}", "repo": f"swesmith/{owner}__{name}.{commit[:8]}",
        "patch": reverse_patch(demo["gold_patch"]), "FAIL_TO_PASS": demo["fail_to_pass"],
        "PASS_TO_PASS": demo.get("pass_to_pass", []), "image_name": image, "problem_statement": demo["instruction"],
        "created_at": "2026-01-01T00:00:00Z",
    }  # fmt: skip


def demo_rows(cache_dir: str | Path) -> tuple[dict[str, dict], Path]:
    """The demo set's SWE rows by id, and its mirrors' directory."""
    from farm.tasks.demo import ensure_demo_set

    demo = ensure_demo_set(cache_dir)
    rows = [json.loads(line) for line in demo.tasks_path.read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in rows if r.get("fail_to_pass")}, demo.mirror_dir


def mirror_of(mirrors: Path, demo: dict) -> Path:
    return mirrors / (demo["workspace"]["repo"].replace("/", "__") + ".git")


SWEGYM_TEMPLATE = "farmgym/sweb.eval.x86_64.{instance_id_docker}:latest"  # tasks.images.datasets.swegym.name


def publish_demo_images(host: str, layout_dir: Path, demo_cache: str | Path) -> dict[str, dict]:
    """Images of five demo tasks in four datasets' layouts, pushed to the registry at ``host``;
    the rows that name them, by kind: ``swebench_eval`` (graded by its eval script),
    ``swebench`` (farm's grader), ``swesmith``, ``swerebench`` (``docker_image``), ``swegym``
    (names no image: ``SWEGYM_TEMPLATE`` under ``tasks.images.registry`` = ``host``)."""
    base = base_layers()
    demos, mirrors = demo_rows(demo_cache)
    layout = OciLayout(layout_dir)

    def publish(demo: dict, name: str, commit: str | None = None) -> str:
        push_image(layout, base, mirror_of(mirrors, demo), commit or demo["workspace"]["base_commit"], f"{host}/{name}")
        return f"{host}/{name}"

    romans, slugs, intervals, wordfreq, lru = (demos[f"demo-{n}"] for n in
                                               ("romans", "slugs", "intervals", "wordfreq", "lrucache"))  # fmt: skip
    fix = intervals["metadata"]["fix_commit"]
    gym = SWEGYM_TEMPLATE.format(instance_id_docker=wordfreq["id"].replace("__", "_1776_").lower())
    publish(wordfreq, gym)
    return {
        "swebench_eval": swebench_row(romans, image=publish(romans, "swebench/sweb.eval.x86_64.demo-romans:latest"),
                                      eval_script=True),
        "swebench": swebench_row(slugs, image=publish(slugs, "swebench/sweb.eval.x86_64.demo-slugs:latest")),
        "swesmith": swesmith_row(intervals, publish(intervals, f"swesmith/swesmith.x86_64.acme_1776_intervals.{fix[:8]}",
                                                    fix)),
        "swerebench": swebench_row(lru, image=publish(lru, "swerebench/sweb.eval.x86_64.demo-lrucache:latest"),
                                   image_field="docker_image"),
        "swegym": swebench_row(wordfreq),
    }  # fmt: skip


R2E_RUN_TESTS = ".venv/bin/python -W ignore -m pytest -rA r2e_tests\n"


def publish_r2e_image(host: str, layout_dir: Path, demo_cache: str | Path, demo_id: str = "demo-tinymatrix") -> dict:
    """An image in R2E-Gym's layout (its runtime's: the repository at ``/testbed`` at the commit,
    its Python environment at ``/testbed/.venv``, ``run_tests.sh`` in the repository running
    ``pytest -rA r2e_tests``, the held-out tests at ``/r2e_tests``), pushed; the row naming it
    (``docker_image``, ``expected_output_json``: every held-out test's status after the fix)."""
    base = base_layers()
    demos, mirrors = demo_rows(demo_cache)
    demo = demos[demo_id]
    layout = OciLayout(layout_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        testbed_tree(tree, mirror_of(mirrors, demo), demo["workspace"]["base_commit"])
        repo = tree / "testbed"
        venv = repo / ".venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\nversion = 3.11\n")
        for name in ("python", "python3"):
            (venv / "bin" / name).symlink_to("/usr/bin/python3")
        (repo / "run_tests.sh").write_text(R2E_RUN_TESTS)
        # the held-out tests: the test files as the fix's commit has them
        subprocess.run(["git", "-C", str(repo), "apply", "-"], input=demo["test_patch"], text=True, check=True,
                       capture_output=True)  # fmt: skip
        held = tree / "r2e_tests"
        held.mkdir()
        (held / "__init__.py").write_text("")
        for rel in sorted({t.split("::")[0] for t in demo["fail_to_pass"] + demo.get("pass_to_pass", [])}):
            shutil.copy2(repo / rel, held / Path(rel).name)
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", "--", "."], check=True)
        subprocess.run(["git", "-C", str(repo), "clean", "-qfd", "--", "tests"], check=True)
        layer = layout.add_layer(tar_of_tree(tree))
    name = f"{host}/namanjain12/{demo_id.removeprefix('demo-')}_final:{demo['workspace']['base_commit'][:12]}"
    tag = hashlib.sha256(name.encode()).hexdigest()[:12]
    layout.add_image(tag, [*base.into(layout)[:1], layer], workdir="/testbed", cmd=["/bin/bash"])
    push(layout, tag, name)
    expected = {t.split("::", 1)[1].replace("::", "."): "PASSED" for t in demo["fail_to_pass"] + demo.get("pass_to_pass", [])}
    return {
        "repo_name": demo["workspace"]["repo"].split("/")[1], "docker_image": name,
        "commit_hash": demo["workspace"]["base_commit"], "problem_statement": demo["instruction"],
        "patch": demo["gold_patch"], "expected_output_json": json.dumps(expected),
    }  # fmt: skip
