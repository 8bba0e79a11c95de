"""The steps farm adds to a recipe's venv (farm/tasks/venvs.py): the venv made a prefix that
keeps its packages whatever path starts its python (tox-current-env's link to
sys.executable), and a conda environment file installed from PyPI as far as PyPI goes, with
what was left out recorded in the setup's report. Real venvs made by uv with pyenv's
pythons, real packages from PyPI, a real local sandbox."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from farm.sandboxes.base import SandboxSpec
from farm.tasks.loaders import load_tasks
from farm.tasks.model import Task
from farm.tasks.runtime import _uv_dir, find_python
from farm.tasks.venvs import conda_env_step, editable_step, left_out, prefix_step, requirements_step
from farm.workspace.prepare import prepare_workspace


@pytest.fixture
def demo(tasks_cfg) -> dict[str, Task]:
    return load_tasks(tasks_cfg).by_id()


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{_uv_dir()}:{os.environ['PATH']}", "UV_PYTHON_DOWNLOADS": "never"}


def _bash(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def _python(link: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(link), "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # over 10 s on 2 cores: two venvs and real installs
@pytest.mark.parametrize("version", ["3.9", "3.12"])  # 3.6-3.10 read pyvenv.cfg beside the resolved binary; 3.11+ do not
def test_a_venv_made_a_prefix_keeps_its_packages_by_any_path(tmp_path: Path, version: str) -> None:
    try:
        python = find_python(version)
    except Exception as exc:  # noqa: BLE001 - a machine without that python
        pytest.skip(str(exc))
    # the packages come from a requirements file read as SWE-bench does: an included file's
    # line that would install the checkout itself is dropped (no project here to build)
    (tmp_path / "requirements_test.txt").write_text("# tests\n-r requirements_min.txt\nsix==1.16.0\n")
    (tmp_path / "requirements_min.txt").write_text("-e .[testutils]\n.[test]\n")
    made = _bash(f"uv venv -q -p {python} .venv && {requirements_step(['requirements-dev.txt', 'requirements_test.txt'])}",
                 tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    # tox-current-env's environment: a link to sys.executable in another directory, first on PATH
    link = tmp_path / ".tox" / "py" / "bin" / "python"
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path / ".venv" / "bin" / "python")
    probe = "import sys, six; print(sys.prefix)"
    before = _python(link, probe)
    assert before.returncode != 0 and "No module named 'six'" in before.stderr  # the bare base interpreter
    step = _bash(prefix_step(), tmp_path)
    assert step.returncode == 0, step.stderr
    venv = str(tmp_path / ".venv")
    # a standard module's real path lies in the standard library's directory (astroid's
    # is_standard_module, pylint's import checks: pylint-dev__astroid-2015 and -1351)
    std = ("import os, sysconfig, datetime, json, _json; lib = os.path.realpath(sysconfig.get_path('stdlib'))"
           "; print([m.__name__ for m in (datetime, json, _json) if not os.path.realpath(m.__file__).startswith(lib)])")
    for path in (link, tmp_path / ".venv" / "bin" / "python", Path(os.path.realpath(link))):
        ran = _python(path, probe)
        assert ran.returncode == 0 and ran.stdout.strip() == venv, (path, ran.stderr)
        ran = _python(path, std)
        assert ran.returncode == 0 and ran.stdout.strip() == "[]", (path, ran.stdout, ran.stderr)
    assert not (tmp_path / ".venv" / "bin" / f"python{version}").is_symlink()  # a binary of its own
    # still a venv to uv, which installs into it; the step again changes nothing
    more = _bash("uv pip install -q --python .venv/bin/python inflection==0.5.1", tmp_path)
    assert more.returncode == 0, more.stderr
    assert _python(link, "import inflection").returncode == 0
    again = _bash(prefix_step(), tmp_path)
    assert again.returncode == 0 and not again.stdout and not again.stderr
    assert _bash(prefix_step(), tmp_path / ".tox").returncode == 0  # no venv in the workdir: nothing to do


BROKEN = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
[project]
name = "farm-broken-native"
version = "1.0"
"""


@pytest.mark.slow  # over 10 s: a venv, four real installs from PyPI and a local build
async def test_a_conda_environment_file_installs_what_pypi_has_and_names_the_rest(
    demo, runtime, new_sandbox
) -> None:
    """An environment file as SWE-bench's specs name them (xarray's ci/requirements/environment.yml):
    a conda pin, a conda-only package, a pip section with a package whose import needs a C
    library that only conda ships (here: its import raises as cfgrib's does without ecCodes)."""
    env_file = textwrap.dedent("""\
        name: tests
        channels:
          - conda-forge
        dependencies:
          - python=3.11
          - six=1.16    # conda's series pin: 1.16.*
          - farm-conda-only-0xdeadbeef
          - pip
          - pip:
            - inflection==0.5.1
            - farm-broken-native @ file://$PWD/broken
        """)  # fmt: skip
    make_broken = (  # a package whose import raises, as cfgrib's does without the ecCodes library
        "mkdir -p broken/farm_broken_native && printf '%s' \"$PYPROJECT\" > broken/pyproject.toml && "
        "echo \"raise RuntimeError('libfarmnative.so not found')\" > broken/farm_broken_native/__init__.py"
    )
    task = demo["demo-generic-sum"].model_copy(update={
        "env": {"PYPROJECT": BROKEN},
        "setup_commands": [make_broken, f"cat > env.yml <<EOF\n{env_file}EOF", "uv venv -q .venv", conda_env_step("env.yml")],
    })  # fmt: skip
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as sb:
        ws = await prepare_workspace(sb, task, runtime)
        assert ws.setup.ok, ws.setup.reason
        assert ws.setup.left_out == [
            "farm-conda-only-0xdeadbeef: not on PyPI",
            f"farm-broken-native @ file://{ws.workdir}/broken: installs from PyPI but does not import here "
            "(import farm_broken_native: RuntimeError: libfarmnative.so not found)",
        ], ws.setup.left_out
        listed = await sb.exec(f"{_uv_dir()}/uv pip freeze --python .venv/bin/python", cwd=ws.workdir, timeout=60)
        frozen = listed.stdout.split()
        assert "six==1.16.0" in frozen and "inflection==0.5.1" in frozen, frozen
        assert not any(f.startswith("farm-broken-native") for f in frozen)  # uninstalled again


def test_left_out_lines_are_read_once_each_in_order() -> None:
    outs = ["x\nfarm-left-out: cdms2: not on PyPI\n", "farm-left-out: hdf5: not on PyPI\nfarm-left-out: cdms2: not on PyPI"]
    assert left_out(outs) == ["cdms2: not on PyPI", "hdf5: not on PyPI"]
    assert left_out(["nothing to say"]) == []


def test_a_requirements_file_is_read_as_swebench_reads_it(tmp_path: Path) -> None:
    """-r files in place (relative to the file naming them, a cycle read once), the lines that
    install the checkout itself and comments dropped in every file, -c paths made absolute,
    the gone types-pkg_resources stubs replaced; no file of the candidates: an error naming them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("requirements_script", Path(__file__).parents[2] / "farm/tasks/requirements_script.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    (tmp_path / "req").mkdir()
    (tmp_path / "req" / "dev.txt").write_text("-r min.txt\n# a comment\nblack==21.8b0\ntypes-pkg_resources==0.1.3\n-c c.txt\n")
    (tmp_path / "req" / "min.txt").write_text("-e .[testutils,spelling]\n.[testutils]\n-r dev.txt\nastroid==2.11.6  # pinned\n")
    lines = script.read(str(tmp_path / "req" / "dev.txt"), set())
    assert lines == ["astroid==2.11.6  # pinned", "black==21.8b0", "types-setuptools", f"-c {tmp_path / 'req' / 'c.txt'}"]
    missing = _bash(requirements_step(["a.txt", "b.txt"]), tmp_path)
    assert missing.returncode == 0 and not missing.stderr  # no venv in the workdir: nothing to do
    assert _bash(f"uv venv -q .venv && {requirements_step(['a.txt', 'b.txt'])}", tmp_path).stderr.strip() == (
        "none of a.txt b.txt in the checkout")


@pytest.mark.slow  # over 10 s: a venv and PyPI's httpbin
def test_the_local_httpbin_answers_http_and_https_on_one_port(tmp_path: Path) -> None:
    """requests' tests up to 2.8 call httpbin at HTTPBIN_URL, some of them over https on the same
    host (test_mixed_case_scheme_acceptable): farm-httpbin serves both on one free port of the
    loopback, with a certificate for localhost that a client trusting it verifies. A test that
    names httpbin.org itself (requests-2317's redirect/5) reaches the same server by that name from
    the test venv's python while HTTPBIN_URL names it; other names resolve as before."""
    import json
    import ssl
    import urllib.request

    from farm.tasks.venvs import HTTPBIN_URL, expand

    assert _bash("uv venv -q .venv", tmp_path).returncode == 0
    made = _bash(expand("farm-httpbin"), tmp_path)
    assert made.returncode == 0, made.stderr
    started = _bash(f"echo {HTTPBIN_URL}", tmp_path)
    url = started.stdout.strip()
    assert started.returncode == 0 and url.startswith("http://localhost:"), started.stderr
    port = url.rsplit(":", 1)[1].rstrip("/")
    probe = ("import socket, ssl, urllib.request, urllib.error, sys\n"
             "assert socket.getaddrinfo('httpbin.org', 443)[0][4] == ('127.0.0.1', int(sys.argv[1]))\n"
             "assert socket.getaddrinfo('localhost', 80)[0][4][1] == 80\n"
             "ctx = ssl.create_default_context(cafile='.venv/httpbin/cert.pem')\n"
             "try:\n    urllib.request.urlopen('https://httpbin.org/status/418', timeout=30, context=ctx)\n"
             "except urllib.error.HTTPError as exc:\n    print(exc.code)\n")  # fmt: skip
    try:
        with urllib.request.urlopen(url + "get", timeout=30) as r:
            assert json.loads(r.read())["url"] == url + "get"
        trusting = ssl.create_default_context(cafile=str(tmp_path / ".venv/httpbin/cert.pem"))
        try:
            urllib.request.urlopen(url.replace("http:", "https:") + "status/418", timeout=30, context=trusting)
            raise AssertionError("418 expected")
        except urllib.error.HTTPError as exc:
            assert exc.code == 418  # the teapot answered over TLS, its certificate verified
        named = _bash(f"HTTPBIN_URL={url} .venv/bin/python -c {shlex.quote(probe)} {port}", tmp_path)
        assert named.returncode == 0 and named.stdout.strip() == "418", named.stderr
        unset = _bash(f"unset HTTPBIN_URL; .venv/bin/python -c {shlex.quote(probe)} {port}", tmp_path)
        assert unset.returncode != 0 and ("AssertionError" in unset.stderr or "gaierror" in unset.stderr), unset.stderr
    finally:
        os.kill(int((tmp_path / f".venv/httpbin/server-{port}.pid").read_text()), signal.SIGTERM)


BOOTSTRAP = {"3.2": "3.1"}  # the file a release copies into the checkouts that vendor it: 3.2 kept 3.1's


def _sdist(name: str, version: str) -> bytes:
    """A source release as PyPI serves one: NAME-VERSION/setup.py and its package, gzipped tar."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, text in ((f"{name}-{version}/setup.py", "from setuptools import setup\nsetup()\n"),
                           (f"{name}-{version}/helpers/__init__.py", f"VERSION = {version!r}\n"),
                           (f"{name}-{version}/bootstrap.py", f"# bootstrap of {BOOTSTRAP.get(version, version[:3])}\n")):  # fmt: skip
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_submodule_the_mirror_lacks_is_filled_from_the_release_of_the_checkouts_date(tmp_path: Path) -> None:
    """farm-submodule (astropy's astropy_helpers): from a PyPI-style JSON index (a local server
    here), the highest release, pre-releases included, uploaded before the checkout's commit
    date, or with a file the project copies into the checkout, the release whose copy it is;
    sha256 checked; nothing done for a commit without that submodule."""
    import hashlib
    import http.server
    import json
    import threading

    from farm.tasks.venvs import submodule_step

    files = {v: _sdist("thing-helpers", v) for v in ("2.0.3", "3.0rc2", "3.0", "3.1", "3.1.1", "3.2")}
    uploaded = {"2.0.3": "2018-01-22T10:00:00", "3.0rc2": "2018-01-22T09:00:00", "3.0": "2018-02-09T10:00:00",
                "3.1": "2018-12-05T10:00:00", "3.1.1": "2019-02-01T10:00:00", "3.2": "2019-06-01T10:00:00"}  # fmt: skip
    tampered = {"3.0rc2"}

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/pypi/thing-helpers/json":
                base = f"http://127.0.0.1:{self.server.server_port}/files"
                body = json.dumps({"releases": {v: [{
                    "packagetype": "sdist", "filename": f"thing-helpers-{v}.tar.gz", "url": f"{base}/{v}",
                    "upload_time": uploaded[v], "digests": {"sha256": hashlib.sha256(files[v]).hexdigest()}}]
                    for v in files}}).encode()  # fmt: skip
            else:
                version = self.path.rsplit("/", 1)[-1]
                body = files[version] + (b"x" if version in tampered else b"")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        repo = tmp_path / "repo"
        repo.mkdir()
        git = "git -c user.name=t -c user.email=t@t"
        assert _bash(f"git init -q && {git} commit -q --allow-empty -m plain && python3 -m venv --without-pip .venv",
                     repo).returncode == 0  # fmt: skip
        step = submodule_step("helpers_dir", "thing-helpers")
        env = f"export FARM_PYPI_URL=http://127.0.0.1:{server.server_port}/pypi; "
        no_submodule = _bash(env + step, repo)  # this commit holds no submodule there: nothing to do
        assert no_submodule.returncode == 0 and not (repo / "helpers_dir").exists(), no_submodule.stderr
        gitlink = "git update-index --add --cacheinfo 160000,0123456789abcdef0123456789abcdef01234567,helpers_dir"
        dated = "GIT_COMMITTER_DATE=2018-02-07T12:00:00+0000"
        assert _bash(f"{gitlink} && {dated} {git} commit -q -m submodule", repo).returncode == 0
        refused = _bash(env + step, repo)  # the release of that date, 3.0rc2, does not match its digest
        assert refused.returncode != 0 and "is not PyPI's" in refused.stderr, refused.stderr
        assert not (repo / "helpers_dir" / "setup.py").exists()
        tampered.clear()
        filled = _bash(env + step, repo)
        assert filled.returncode == 0, filled.stderr
        assert "helpers_dir <- thing-helpers 3.0rc2" in filled.stdout  # not 2.0.3 (older line), not 3.0 (after)
        assert (repo / "helpers_dir" / "helpers" / "__init__.py").read_text() == "VERSION = '3.0rc2'\n"
        assert _bash(env + step, repo).stdout == ""  # already there: nothing done again
        # with a file the project copies into its vendoring checkouts: the release whose copy it is
        (repo / "bootstrap.py").write_text("# bootstrap of 3.1\n")
        _bash("rm -rf helpers_dir", repo)
        same = _bash(env + submodule_step("helpers_dir", "thing-helpers", "bootstrap.py"), repo)
        # 3.1 and its bugfix 3.1.1 both copy it: the bugfix (a release's packaging slip is fixed in the next);
        # not 3.2, of another series though its copy is the same
        assert same.returncode == 0 and "helpers_dir <- thing-helpers 3.1.1 (its bootstrap.py is" in same.stdout, same
        assert (repo / "helpers_dir" / "helpers" / "__init__.py").read_text() == "VERSION = '3.1.1'\n"
    finally:
        server.shutdown()


@pytest.mark.slow  # real builds from PyPI: setuptools 62 by uv, then by pip
def test_a_checkout_uv_cannot_install_editable_is_installed_by_pip(tmp_path: Path) -> None:
    """pylint-dev__astroid-1741: its build backend is setuptools~=62.6, which has no PEP 660
    editable hook. uv refuses such a checkout; the book's step (farm-install-editable) then lets
    pip install it, as SWE-bench's spec does (pip falls back to the checkout's ``setup.py develop``).
    Any other refusal of uv stays the step's failure: pip does not retry it."""
    from farm.tasks.recipes import load_book

    recipe = load_book("builtin").lookup("pylint-dev/astroid", "2.15").recipe
    assert "farm-install-editable" in recipe.setup
    # the recipe's env: uv resolves (and seeds the venv's pip) as of its date; pip 25.1 and later
    # no longer fall back to setup.py develop
    env = "".join(f"export {k}={v}; " for k, v in recipe.env.items())
    env += "export COLUMNS=40; "  # uv wraps its report to the terminal's width (CI's run did): a narrow one
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools~=62.6", "wheel"]\nbuild-backend = "setuptools.build_meta"\n')
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = oldpin\nversion = 0.1\n\n[options]\npy_modules = oldpin\n")
    (tmp_path / "setup.py").write_text("from setuptools import setup\n\nsetup()\n")  # astroid's shim, as pip's fallback needs
    (tmp_path / "oldpin.py").write_text("ANSWER = 42\n")
    made = _bash(f"{env}uv venv -q --seed -p {find_python(recipe.python)} .venv", tmp_path)
    assert made.returncode == 0, made.stderr
    uv_alone = _bash(f"{env}uv pip install -q --python .venv/bin/python -e .", tmp_path)
    assert uv_alone.returncode != 0 and "build_editable" in uv_alone.stderr, uv_alone.stderr[-2000:]
    ran = _bash(env + editable_step(), tmp_path)
    assert ran.returncode == 0 and "pip installs it" in ran.stderr, ran.stderr[-2000:]
    assert _python(tmp_path / ".venv" / "bin" / "python", "import oldpin; print(oldpin.ANSWER)").stdout.strip() == "42"
    # a checkout uv refuses for another reason: the step fails with uv's words, pip never runs
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n')
    (tmp_path / "setup.py").write_text("open('runs', 'a').write('x')\nraise SystemExit('broken setup.py')\n")
    by_uv = _bash(f"{env}uv pip install -q --python .venv/bin/python -e .", tmp_path)
    assert by_uv.returncode != 0 and (tmp_path / "runs").exists()
    uv_runs = (tmp_path / "runs").read_text()
    (tmp_path / "runs").unlink()
    broken = _bash(env + editable_step(), tmp_path)
    assert broken.returncode != 0 and "broken setup.py" in broken.stderr and "pip installs it" not in broken.stderr, broken.stderr
    assert (tmp_path / "runs").read_text() == uv_runs  # setup.py ran as often as uv alone runs it: pip never did
