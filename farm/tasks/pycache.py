"""pytest's caches of a host interpreter's plugins, written before its first sandbox; an
environment's venvs' bytecode and plugin caches, written by its build (``snapshot_warm_script``).

A local sandbox shows the task's interpreter read-only (a version found on this machine,
or farm's own venv for ``tasks.python=auto``). pytest rewrites the asserts of every plugin
it loads from an entry point (hypothesis, anyio, xdist, pytest-asyncio...) and keeps the
result only as ``__pycache__/<module>.cpython-3X-pytest-<version>.pyc`` beside the module,
written by the first run that may write there: in a sandbox, none. So every test run and
every ``pytest`` an agent calls rewrites them all again, and that is most of a small
test run's CPU: the demo task's graded test run takes 0.42 s CPU with these caches and
1.0-1.1 s without them (hypothesis's ~80 modules rewritten each time); the bare CLIs of
``bench_density --baseline bare``, run on the host, read the caches once a run wrote them,
so without them farm's test runs and tools cost twice the bare ones'.

:func:`warm_pytest_plugins` writes them once, on the host, where farm may write: the
interpreter collects an empty directory (every entry-point plugin loaded, so rewritten and
cached; no test, no conftest, no cache dir). pytest checks a cache against its module's
mtime and size, so a stale one is rewritten as before. Best effort: an interpreter without
pytest, a prefix farm cannot write (pytest then keeps the rewrite in memory), a timeout:
logged, never an error. The plugins run there as they do in any pytest on this host: they
are the host's own packages, which no sandbox can write.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import tempfile

from farm.tasks.repos import run_host

log = logging.getLogger(__name__)

_warmed: set[str] = set()  # interpreters whose warming ran in this process
_warming: dict[str, asyncio.Future[bool]] = {}  # ... or runs now

# pytest's exit codes meaning the collection ran: 0 = tests found (none here), 5 = none found
_COLLECTED = (0, 5)
_SCRIPT = (
    "import sys\n"
    "try:\n"
    "    import pytest\n"
    "except ImportError:\n"
    "    sys.exit(5)\n"
    "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', '--rootdir', sys.argv[1], sys.argv[1]]))\n"
)


async def warm_once(exe: str) -> None:
    """:func:`warm_pytest_plugins` for ``exe`` once a process, whoever asks first (the others
    wait for it; an asker cancelled leaves it running)."""
    if exe in _warmed:
        return
    run = _warming.get(exe)
    if run is None or run.get_loop() is not asyncio.get_running_loop():  # (another loop's, never finished)
        run = _warming[exe] = asyncio.ensure_future(warm_pytest_plugins(exe))

        def ran(done: asyncio.Future[bool]) -> None:
            if _warming.get(exe) is done:
                del _warming[exe]
            if not done.cancelled():  # (its loop closed under it: the next asker runs it again)
                _warmed.add(exe)

        run.add_done_callback(ran)
    await asyncio.shield(run)


async def warm_pytest_plugins(exe: str, *, timeout_s: float = 120.0) -> bool:
    """Write pytest's rewritten-module caches of ``exe``'s entry-point plugins (see the
    module doc). True when nothing is left to do (the collection ran, or no pytest). Run in
    ``run_host``'s minimal environment: nothing of farm's process (PYTHONDONTWRITEBYTECODE,
    PYTEST_ADDOPTS, PYTEST_DISABLE_PLUGIN_AUTOLOAD, PYTHONPATH) keeps a plugin unloaded or
    its cache unwritten."""
    with tempfile.TemporaryDirectory(prefix="farm-pytest-warm-") as empty:
        try:
            code, out = await run_host([exe, "-c", _SCRIPT, empty], cwd=empty, timeout=timeout_s, tail=500)
        except OSError as exc:
            log.warning("pytest caches of %s not written: %s", exe, exc)
            return False
        except TimeoutError:
            log.warning("pytest caches of %s not written: no answer in %g s", exe, timeout_s)
            return False
    if code not in _COLLECTED:
        log.warning("pytest caches of %s not written: its collection exited %s: %s", exe, code, out)
        return False
    return True


# An environment's build (``farm.envs.build``): the venvs its setup made in the workdir are
# part of the snapshot every later sandbox shows, and no sandbox keeps what it writes there.
# uv (the recipes' installer) writes no bytecode by default (pip does), and no setup runs
# pytest: so every graded test run and every agent's first `python`/`pytest` in a sandbox on
# the snapshot compiled every module it imported and rewrote every plugin (a venv of pytest,
# hypothesis and requests: 1.1 s CPU a test run without them, 0.33 s with them). The build
# writes both once, in its own sandbox, before the snapshot is taken: each venv (a
# ``pyvenv.cfg`` at most two directories down) compiles its ``lib`` (compileall; timestamp
# pycs, checked against their source's mtime and size like any others: the snapshot keeps
# mtimes) and collects an empty directory. Best effort: a file that does not compile (a
# Python 2 test fixture), an interpreter without pytest or without ``compileall -j``:
# nothing is written for it, nothing fails. The variables that would keep a cache unwritten
# or a plugin unloaded are unset (a checked-hash pyc for SOURCE_DATE_EPOCH: a hash a read).
# A venv warmed once holds a marker (``WARMED_MARKER``): a later build on it (an instance on
# its base, whose setup may install the checkout and its dependencies) compiles only the
# sources created or changed since (their ctime, which no installer sets back), and collects
# again only then: walking a numpy/pandas/scipy venv file by file cost each instance seconds.
SNAPSHOT_WARM_LABEL = "farm: the venvs' bytecode and pytest caches"
WARMED_MARKER = ".farm-caches-written"


_VENVS = "shopt -s dotglob  # .venv\nset -- ./pyvenv.cfg ./*/pyvenv.cfg ./*/*/pyvenv.cfg\n"
# Python and pytest trust a cache whose source has the mtime it recorded, in whole seconds, and
# its size: a same-size edit (a `*` made a `/`) in the second the source was written would run
# the stale code. The build ends a second after its last write, so no later edit can be in that
# second (validate-tasks grades a gold patch right after the build: it was).
_NEXT_SECOND = "sleep 1\n"


def snapshot_warm_script() -> str:
    """Bash, run in the workdir: each venv's bytecode and pytest plugin caches written; prints
    each venv it warmed."""
    return (
        "unset SOURCE_DATE_EPOCH PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX PYTHONPATH PYTEST_ADDOPTS "
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD PYTEST_PLUGINS\n"
        f"{_VENVS}for cfg; do\n"
        f'  v=${{cfg%/pyvenv.cfg}}; py="$v/bin/python"; m="$v/{WARMED_MARKER}"\n'
        '  [ -f "$cfg" ] && [ -x "$py" ] || continue\n'
        '  if [ -e "$m" ]; then\n'
        '    new=$(mktemp) || continue\n'
        '    find "$v/lib" -name "*.py" -cnewer "$m" > "$new" 2>/dev/null; n=$(wc -l < "$new")\n'
        '    [ "$n" -eq 0 ] || "$py" -m compileall -q -i "$new" >/dev/null 2>&1\n'
        '    rm -f "$new"; [ "$n" -gt 0 ] || continue  # nothing new: no collection either\n'
        "  else\n"
        '    "$py" -m compileall -q -j 0 "$v/lib" >/dev/null 2>&1\n'
        "  fi\n"
        '  d=$(mktemp -d) || continue\n'
        f'  (cd "$d" && "$OLDPWD/$py" -c {shlex.quote(_SCRIPT)} "$d" >/dev/null 2>&1)\n'
        '  rm -rf "$d"; touch "$m"; echo "$v"; warmed=1\n'
        "done\n"
        f"[ -z \"${{warmed:-}}\" ] || {_NEXT_SECOND}"
        "exit 0\n"
    )


# The repository's own modules are most of what a big project's test run imports (Django's
# runtests.py: its own ~300 modules), compiled again in every sandbox. The build compiles them
# too, AFTER the workspace's baseline commit (never part of it: untracked, and the diff's
# capture leaves __pycache__ out), with the interpreter the tests run (the workdir's first venv,
# else `python3` on the task's PATH). A file the agent or the patch changes gets a new mtime:
# its cache is stale and Python compiles it again, as for any edit. Where the repository's own
# ignore rules do not hide __pycache__ (most do; a repository made from a release's sdist has
# no .gitignore), `git status` would show the agent directories it did not make: they go in
# .git/info/exclude, as the environment's own paths do (``farm.workspace.prepare.exclude``).
REPO_COMPILE_LABEL = "farm: the repository's bytecode"


def repo_compile_script() -> str:
    """Bash, run in the workdir: its modules compiled (not .git's) by the tests' interpreter."""
    return (
        "unset SOURCE_DATE_EPOCH PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX\n"
        "g() { git -c 'safe.directory=*' \"$@\"; }\n"
        "if ! g check-ignore -q __pycache__/farm.cpython-3.pyc 2>/dev/null; then\n"
        "  x=$(g rev-parse --git-path info/exclude) && mkdir -p \"$(dirname \"$x\")\" &&\n"
        "    echo __pycache__/ >> \"$x\" || exit 0\n"
        "fi\n"
        f"{_VENVS}py=\n"
        'for cfg; do\n'
        '  v=${cfg%/pyvenv.cfg}; [ -f "$cfg" ] && [ -x "$v/bin/python" ] && { py=$v/bin/python; break; }\n'
        "done\n"
        '[ -n "$py" ] || py=$(command -v python3 || command -v python) || exit 0\n'
        # the workdir's entries but its venvs (their caches are the other step's) and .git
        "t=(); for e in ./*; do [ \"$e\" = ./.git ] || [ -f \"$e/pyvenv.cfg\" ] || t+=(\"$e\"); done\n"
        "[ ${#t[@]} -eq 0 ] || \"$py\" -m compileall -q -j 0 -x '/[.]git/' \"${t[@]}\" >/dev/null 2>&1\n"
        f'echo "$py"; {_NEXT_SECOND}'
        "exit 0\n"
    )
