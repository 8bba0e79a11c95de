"""The Harness protocol: install, configure, launch and collect one coding-agent CLI.

One rollout, as the sandbox actor drives it::

    harness = make_harness(cfg.harness)
    await harness.install()                      # host: pinned npm package in the shared cache (once)
    plan = await harness.configure(sandbox, run) # sandbox: CLI visible, config files, argv + env
    result = await harness.launch(sandbox, plan) # run within run.budget_s, watch, kill, collect

(or ``await harness.run(sandbox, run)`` for all three). The shared lifecycle lives here
and in ``farm.harnesses.runner``; each CLI's specifics (binary, config files, argv,
env, how its JSON stream reports errors) live in ``claude_code.py``, ``codex.py``,
``opencode.py``. Everything farm writes goes to a scratch dir outside the task's
workdir (``LaunchPlan.files_written``); the instruction reaches the CLI on stdin (exact
text, no argv quoting or length limits).
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
import platform

from farm.errors import HarnessInstallError, SandboxError
from farm.harnesses.config import HarnessConfig
from farm.harnesses.install import NpmPackage, ensure_package, ensure_tarball, pinned_package
from farm.harnesses.plan import HarnessResult, HarnessRun, LaunchPlan, diff_excludes  # noqa: F401 - re-exported
from farm.harnesses.runner import run_plan
from farm.sandboxes.base import Sandbox

# Login shells (Codex runs every command with ``bash -lc``) source /etc/profile, which
# resets PATH; the runner exports the CLI's PATH as FARM_LOGIN_PATH and this puts it back.
LOGIN_PROFILE = """# written by farm: login shells keep the PATH the agent CLI was started with
if [ -n "${FARM_LOGIN_PATH:-}" ]; then export PATH="$FARM_LOGIN_PATH"; fi
if [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi
"""


def package_dir_of(binary: Path, prefix: Path) -> Path:
    """The npm package dir (the one with package.json) that holds ``binary``."""
    node = binary.parent
    while node != prefix and prefix in node.parents:
        if (node / "package.json").is_file():
            return node
        node = node.parent
    raise HarnessInstallError(f"{binary} is not inside an npm package under {prefix}")


class Harness(ABC):
    """One coding-agent CLI. Subclasses fill in the per-CLI hooks below."""

    name: ClassVar[str]

    def __init__(self, config: HarnessConfig | None = None, *, npm: str = "npm") -> None:
        self.config = config if config is not None else HarnessConfig(name=self.name)  # type: ignore[arg-type]
        self._npm = npm
        self._host_binary: Path | None = None
        self._install_lock = asyncio.Lock()
        self._shown: set[tuple[str, str | None, str]] = set()  # (sandbox kind, image, path): found executable

    # --- per-CLI hooks -----------------------------------------------------------
    @abstractmethod
    def find_binary(self, prefix: Path) -> Path:
        """The native executable inside an installed npm prefix (not the npm wrapper)."""

    @abstractmethod
    def config_files(self, run: HarnessRun, scratch: str) -> dict[str, str]:
        """Absolute sandbox path -> content, written before launch."""

    @abstractmethod
    def environment(self, run: HarnessRun, scratch: str) -> dict[str, str]:
        """The CLI's env (gateway URL, secret, offline flags, model aliases)."""

    @abstractmethod
    def arguments(self, run: HarnessRun) -> list[str]:
        """argv after the binary (the instruction comes on stdin)."""

    @abstractmethod
    def stream_error(self, events: list[dict[str, Any]]) -> str | None:
        """The error the CLI reported in its JSON stream, if its run failed."""

    @abstractmethod
    def final_message(self, events: list[dict[str, Any]]) -> str | None:
        """The agent's last answer text."""

    def retry_loop(self, events: list[dict[str, Any]]) -> str | None:
        """Why the CLI is stuck retrying a model request (trailing retry events), or None."""
        return None

    # --- install -------------------------------------------------------------------
    @property
    def package(self) -> NpmPackage:
        return pinned_package(self.name, self.config.versions.get(self.name))  # type: ignore[arg-type]

    async def install(self) -> Path:
        """Ensure the pinned package is in the host cache; return the host path of its executable."""
        async with self._install_lock:
            if self._host_binary is None:
                prefix = await asyncio.to_thread(
                    ensure_package,
                    self.package,
                    self.config.npm_cache_dir,
                    npm=self._npm,
                    registry=self.config.npm_registry,
                    timeout_s=self.config.install_timeout_s,
                )
                binary = self.find_binary(prefix)
                if not os.access(binary, os.X_OK):
                    raise HarnessInstallError(f"{self.package.spec}: {binary} is not executable")
                self._host_binary = binary
            return self._host_binary

    async def provision(self, sandbox: Sandbox) -> str:
        """Make the CLI runnable inside ``sandbox``; return its path there.

        ``bin_path`` from config (a template with the CLI) wins; else the host cache path
        when the sandbox sees it (local sandboxes: host dirs are visible read-only; one whose
        root is a container image runs its relinked copy, ``host_program``); else the
        executable's npm package is uploaded as a tarball (E2B without a template).
        """
        seen = await self._seen_path(sandbox)
        if seen and await _is_executable(sandbox, seen):
            return seen
        return await self._unseen(sandbox)

    async def _seen_path(self, sandbox: Sandbox) -> str | None:
        """Where the sandbox should see the CLI without an upload (not checked yet)."""
        if self.config.bin_path:
            return self.config.bin_path
        host_bin = await self.install()
        shown = getattr(sandbox, "host_program", None)  # a local sandbox: where it runs a host program
        return (shown(str(host_bin)) if shown is not None else str(host_bin)) or None

    async def _unseen(self, sandbox: Sandbox) -> str:
        """The CLI is not executable where ``_seen_path`` said: bin_path's error, or the upload."""
        if self.config.bin_path:
            raise HarnessInstallError(f"harness.bin_path {self.config.bin_path} is not executable in the sandbox")
        host_bin = await self.install()
        prefix = self._prefix_of(host_bin)
        member = package_dir_of(host_bin, prefix)
        tar = await asyncio.to_thread(ensure_tarball, prefix, member, timeout_s=self.config.install_timeout_s)
        remote_prefix = f"{self.config.upload_dir or sandbox.root + '/.farm/cli'}/{prefix.name}"
        await sandbox.upload_tarball(str(tar), remote_prefix)
        remote_bin = f"{remote_prefix}/{host_bin.relative_to(prefix)}"
        if not await _is_executable(sandbox, remote_bin):
            raise HarnessInstallError(f"uploaded {self.package.spec} but {remote_bin} is not executable in the sandbox")
        return remote_bin

    async def host_prefix(self) -> Path | None:
        """The host npm prefix holding this CLI (what a local sandbox must see read-only
        to run it from the host cache); None when ``bin_path`` names a CLI in the image."""
        if self.config.bin_path:
            return None
        return self._prefix_of(await self.install())

    def _prefix_of(self, host_bin: Path) -> Path:
        for parent in host_bin.parents:
            if parent.name == "node_modules":
                return parent.parent
        raise HarnessInstallError(f"{host_bin} is not inside an npm prefix")

    # --- configure -----------------------------------------------------------------
    def scratch_dir(self, sandbox: Sandbox) -> str:
        """Under the sandbox's own /tmp, a path that is the same in every sandbox: the CLIs
        write their HOME and config paths into the model's prompt (Codex lists its skills under
        CODEX_HOME), and a path holding the sandbox's id made every rollout's system prompt
        differ (the gateway then tokenized it whole each time, an engine could not share its
        prefix across rollouts)."""
        return self.config.scratch_dir or f"{sandbox.tmp}/.farm/harness"

    async def configure(self, sandbox: Sandbox, run: HarnessRun) -> LaunchPlan:
        """Provision the CLI, write its config files and the instruction; return the plan."""
        seen = await self._seen_path(sandbox)
        scratch = self.scratch_dir(sandbox)
        home = f"{scratch}/home"
        files = {
            f"{scratch}/instruction.txt": run.instruction,
            f"{home}/.bash_profile": LOGIN_PROFILE,
            **self.config_files(run, scratch),
        }
        # A host program a sandbox shows read-only (``host_program``: a local sandbox) cannot
        # change in there: found executable in one sandbox of a kind, it is in the next. Then no
        # command runs here (each command a sandbox runs is a jail's start): the scratch dir is
        # emptied and the files written from outside, and the CLI's own command is the sandbox's
        # first (its jail proven when it ends: ``farm.sandboxes.bwrap.FirstCommand``).
        shown = (type(sandbox).__name__, getattr(sandbox, "image", None), seen or "")
        anew = getattr(sandbox, "write_files_anew", None)
        if shown in self._shown and anew is not None:
            await anew(scratch, files)  # one host job (local)
            binary = str(seen)
        else:
            binary = await self._prepare(sandbox, scratch, seen)
            if binary == seen and not self.config.bin_path and getattr(sandbox, "host_program", None) is not None:
                self._shown.add(shown)
            await sandbox.write_files(files)  # one host job for them all (local)
        env = {"HOME": home, **run.env, **self.environment(run, scratch), **self.config.extra_env}
        return LaunchPlan(
            harness=self.name,
            binary=binary,
            argv=[binary, *self.arguments(run), *self.config.extra_args],
            env=env,
            cwd=run.workdir,
            scratch_dir=scratch,
            stdin_path=f"{scratch}/instruction.txt",
            stdout_path=f"{scratch}/stdout.jsonl",
            stderr_path=f"{scratch}/stderr.txt",
            files_written=sorted(files),
            gateway_url=run.gateway_url,
            budget_s=run.budget_s,
        )

    async def _prepare(self, sandbox: Sandbox, scratch: str, seen: str | None) -> str:
        """The scratch dir emptied and the CLI checked executable where the sandbox sees it, in
        one command; the CLI's path (uploaded when it is not there). The scratch's directories
        are made by the writes after it (``write_files`` makes a file's parents, and each holds a
        file: HOME its .bash_profile). It needs no gateway: a rollout runs it before the
        session's socket is served, so its jail starts no relay; the gateway is asked by the
        launch's own command, before the CLI (runner.run_plan)."""
        prep = await sandbox.exec(["bash", "-c", _PREPARE, "farm", scratch, seen or ""], timeout=60)
        if prep.exit_code not in (0, _NOT_EXECUTABLE):
            raise SandboxError(f"cannot prepare harness scratch dir {scratch}: {prep.stderr.strip()[-500:]}")
        return seen if seen and prep.exit_code == 0 else await self._unseen(sandbox)

    # --- launch --------------------------------------------------------------------
    async def launch(self, sandbox: Sandbox, plan: LaunchPlan, *,
                     session_idle_s: Callable[[], float] | None = None) -> HarnessResult:
        """Probe the gateway, run the CLI within its budget, collect and classify.
        ``session_idle_s``: seconds since the gateway last served this rollout's session (0
        while a request is in flight); the watch skips its probe while that is recent."""
        return await run_plan(self, sandbox, plan, session_idle_s=session_idle_s)

    async def run(self, sandbox: Sandbox, run: HarnessRun, *,
                  session_idle_s: Callable[[], float] | None = None) -> HarnessResult:
        """install + configure + launch."""
        await self.install()
        plan = await self.configure(sandbox, run)
        return await self.launch(sandbox, plan, session_idle_s=session_idle_s)


# configure's one command: $1 the scratch dir (removed when a run before left it: the writes
# make it anew), $2 the CLI's path ("" to skip its check). Bash's builtins only, but for an rm
# that runs only when there is something to remove.
_NOT_EXECUTABLE = 97
_PREPARE = (
    'if [ -e "$1" ] || [ -L "$1" ]; then rm -rf "$1" || exit 1; fi; '
    f'[ -z "$2" ] || [ -x "$2" ] || exit {_NOT_EXECUTABLE}'
)


async def _is_executable(sandbox: Sandbox, path: str) -> bool:
    res = await sandbox.exec(["test", "-x", path], timeout=30)
    return res.exit_code == 0


def first_executable(candidates: list[Path], what: str) -> Path:
    """The first candidate that exists and is executable (per-CLI binary lookup)."""
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    tried = ", ".join(str(p) for p in candidates) or "(none found)"
    raise HarnessInstallError(f"{what}: no native executable found; tried {tried}")


def node_arch() -> str:
    """Node's name for this machine's CPU (npm platform packages are named after it)."""
    machine = platform.machine().lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
