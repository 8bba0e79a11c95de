"""The container-image half of a local sandbox: when its view is an image's whole root.

Who its commands run as (the image's ``User``, looked up in the image's own ``/etc/passwd``),
where the host programs it runs are (relinked once per node: ``farm.sandboxes.hostrt``), and
what of the host its jail adds to the image (``HostMounts.of_image``).
"""

from __future__ import annotations

import os
import shutil
import stat

from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.bwrap import HostMounts
from farm.sandboxes.hostrt import HELPERS, HostRuntime
from farm.sandboxes.hostview import ImageUser, image_user

_NAME_FILES = ("/etc/resolv.conf", "/etc/hosts")  # the host's, over the image's (as docker gives a container)


class LocalImage:
    """Mixin for LocalSandbox: needs ``_spec``, ``home``, ``_view_map`` (and calls ``_ro_binds``)."""

    _spec: SandboxSpec
    home: str
    _view_map: tuple[str, str] | None
    image: bool
    _image_user: ImageUser | None
    _runtime: HostRuntime | None
    _runtime_dir: str

    def _init_image(self, runtime_dir: str) -> None:
        view = self._spec.view
        self.image = view is not None and view.root  # its root is a container image's file system
        self._image_user = None  # who its commands run as (the image's User), once mounted
        self._runtime = HostRuntime(runtime_dir) if self.image else None
        self._runtime_dir = ""

    def _image_ready(self, host_root: str) -> None:
        """After the image's view is mounted at ``host_root``: its user, and the relinked programs."""
        assert self._runtime is not None and self._spec.view is not None
        self._image_user = image_user(host_root, self._spec.view.user)
        if self._image_user.home:
            self.home = self._image_user.home
        helpers = [self._runtime.helper(h) for h in HELPERS]
        self._runtime_dir = str(self._runtime.ensure([*helpers, *self._spec.host_programs]))

    def host_program(self, path: str) -> str | None:
        """Where the host executable ``path`` runs inside: the path itself (the host is shown
        read-only), or in a container image's sandbox its relinked copy (None unless it is one
        of the spec's ``host_programs``: only those are relinked)."""
        if self._runtime is None:
            return path
        return self._runtime.in_jail(path) if path in self._spec.host_programs else None

    def _in_jail(self, host_path: str) -> str:
        """A host helper's path as the jail runs it (relinked in a container image's)."""
        return self._runtime.in_jail(host_path) if self._runtime is not None else host_path

    def _helper_tools(self) -> dict[str, str]:
        """grep and sleep for the port forwarder's wait (the image's may be missing)."""
        if not self.image:
            return {}
        return {name: self._in_jail(shutil.which(name) or name) for name in ("grep", "sleep")}

    def _image_mounts(self, ro_binds: list[str]) -> HostMounts:
        assert self._view_map is not None
        etc = [p for p in _NAME_FILES if _plain_file_or_absent(self._view_map[0] + p)]
        return HostMounts.of_image(self._runtime_dir, etc, ro_binds)

    def _image_ids(self, user: str | None, unshare_user: bool) -> tuple[int | None, int | None] | None:
        """(uid, gid) of a command run as the image's user (None: not an image, or a user asked for)."""
        if user is not None or self._image_user is None:
            return None
        return (self._image_user.uid, self._image_user.gid) if unshare_user else (None, None)


def _plain_file_or_absent(path: str) -> bool:
    """The host may bind its file over an image's ``path`` (not over a symlink or a directory)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True
