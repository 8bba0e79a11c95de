"""The file half of the local sandbox protocol: host paths, read/write, uploads.

A sandbox's files are plain host files under its root and its private /tmp; every call
refuses a path (or a symlink) that leads anywhere else.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tarfile
from collections.abc import Mapping
from pathlib import Path

from farm.errors import SandboxClosed, SandboxError, SandboxFileNotFound
from farm.sandboxes.local_dirs import remove_tree
from farm.sandboxes.watchdog import Watchdog


def _within(path: str, area: str) -> bool:
    return path == area or path.startswith(area.rstrip(os.sep) + os.sep)


class LocalFiles:
    """Mixin for LocalSandbox: needs ``id``, ``root``, ``_tmp_dir``, ``_view_map``, ``_isolated``, ``_closed``,
    ``_watchdog`` (told of every write: its next round sums the disk use)."""

    id: str
    root: str
    _tmp_dir: str
    _view_map: tuple[str, str] | None  # (host dir, path inside the sandbox) of its environment view
    _isolated: bool
    _closed: bool
    _watchdog: Watchdog

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")

    # --- files ---------------------------------------------------------------
    def host_path(self, path: str) -> Path:
        """Where a sandbox path lives on the host; refuses anything outside root, /tmp and
        the environment view."""
        self._check_open()
        inside = os.path.normpath(path if os.path.isabs(path) else os.path.join(self.root, path))
        areas = [self.root, self._tmp_dir]
        if self._isolated and _within(inside, "/tmp") and not _within(inside, self.root):
            inside = self._tmp_dir + inside[len("/tmp") :]
        if self._view_map is not None:
            host, mount = self._view_map
            areas.append(host)
            # a container image's view is the whole root; the sandbox's own root and /tmp are bound over it
            bound_over = mount == "/" and any(_within(inside, a) for a in (self.root, self._tmp_dir))
            if _within(inside, mount) and not bound_over:
                inside = host + inside[len(mount.rstrip("/")) :]
        real = os.path.realpath(inside)
        if not any(_within(real, area) for area in areas):
            raise SandboxError(f"{path}: outside the sandbox's writable areas ({', '.join(areas)})")
        return Path(real)

    async def write_file(self, path: str, data: str | bytes) -> None:
        await self.write_files({path: data})

    async def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Every file in one worker-thread job, paths checked there (``host_path``: a
        realpath each, off the event loop); stops at the first that fails."""
        self._check_open()
        try:
            await asyncio.to_thread(self._write, list(files.items()))
        finally:
            self._watchdog.wrote()

    async def write_files_anew(self, directory: str, files: Mapping[str, str | bytes]) -> None:
        """``directory`` removed with what a run before left in it (a symlink there removed
        itself, never followed), then ``files`` written as ``write_files`` does, in the same
        worker-thread job: what a command's ``rm -rf`` did, without the command (a jail's start)."""
        self._check_open()
        parent, name = os.path.split(os.path.normpath(directory))
        if name in ("", ".", ".."):  # ("..": a relative path above the root, normalised)
            raise SandboxError(f"{directory}: not a directory to remove in sandbox {self.id}")
        items = list(files.items())

        def write() -> None:
            gone = self.host_path(parent) / name  # its parent resolved and checked; itself not followed
            try:
                if gone.is_dir() and not gone.is_symlink():
                    remove_tree(gone)  # (a read-only directory the sandbox made in it too)
                elif gone.is_symlink() or gone.exists():
                    gone.unlink()
            except OSError as exc:
                raise SandboxError(f"cannot remove {directory} in sandbox {self.id}: {exc}") from exc
            self._write(items)

        try:
            await asyncio.to_thread(write)
        finally:
            self._watchdog.wrote()

    def _write(self, items: list[tuple[str, str | bytes]]) -> None:
        for path, data in items:
            target = self.host_path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)

    async def read_file(self, path: str) -> bytes:
        return await self._read(path, None)

    async def read_tail(self, path: str, n: int) -> bytes:
        return await self._read(path, n)

    async def _read(self, path: str, tail: int | None) -> bytes:
        """The file's bytes (its last ``tail`` only, when given), never through a symlink."""
        target = self.host_path(path)

        def read() -> bytes:
            try:
                fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                raise SandboxFileNotFound(f"{path}: no such file in sandbox {self.id}") from None
            with os.fdopen(fd, "rb") as fh:
                if tail is None:
                    return fh.read()
                fh.seek(max(0, os.fstat(fd).st_size - tail))
                return fh.read(tail)

        return await asyncio.to_thread(read)

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        target = self.host_path(remote_dir)
        if not os.path.isdir(local_dir):
            raise SandboxError(f"upload_dir: {local_dir} is not a directory")
        try:
            await asyncio.to_thread(shutil.copytree, local_dir, target, symlinks=True, dirs_exist_ok=True)
        finally:
            self._watchdog.wrote()

    async def upload_tarball(self, local_tar: str, remote_dir: str) -> None:
        target = self.host_path(remote_dir)

        def extract() -> None:
            target.mkdir(parents=True, exist_ok=True)
            try:
                with tarfile.open(local_tar) as tar:
                    tar.extractall(target, filter="data")
            except (OSError, tarfile.TarError) as exc:
                raise SandboxError(f"upload_tarball {local_tar}: {exc}") from exc

        try:
            await asyncio.to_thread(extract)
        finally:
            self._watchdog.wrote()
