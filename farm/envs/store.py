"""The snapshot cache on disk: one directory per environment key.

Layout (``envs.cache_dir``, mode 0700: no sandbox ever sees it; a snapshot reaches a
sandbox only as the lower layer of its private view)::

    <cache>/<key>/meta.json        the EnvRecord: kind, identity, setup report, commits, size, build time
    <cache>/<key>/tree/            the frozen tree (only when the build succeeded): a whole workspace
                                   (kind env), a base layer (kind base: the venv) or an instance layer
                                   (kind instance: the checkout and what its setup added, over its base)
    <cache>/<key>/last_used        its mtime is the last use (LRU for ``gc``)
    <cache>/.build/<key>.<rand>/   a build in progress; never read; renamed into place whole
    <cache>/.locks/<key>.lock      flock: one build per key across every process of this node
    <cache>/.blobs/                container images' manifests and configs by digest, their tags, and
                                   layer blobs while they download (``farm.images.pull``; a layer's blob
                                   is removed once it is unpacked)

A snapshot appears by one ``rename`` of a complete directory (meta.json written and
synced first), so a crash mid-build leaves only a ``.build`` remnant (cleaned by the next
build or ``gc``), never a half-built snapshot. A failed build is published the same way
with ``ok: false`` and no tree: every later rollout of that environment reads the
failure instead of building again (``farm envs rm --failed`` forgets failures).

A container image (``farm.envs.image``) is two kinds of record: a **layer** per unpacked
layer (kind ``layer``: its tree and the paths it deletes, keyed by the layer's content, so
images that share a layer share it), and the **image** (kind ``image``: no tree; its layers,
top first, and the environment its processes start with). An instance environment of an
image task stacks on the image record as on a base.

A base stays while an instance built on it is in the cache: ``remove`` refuses it (``force``
removes its instances with it) and ``gc`` takes its instances first. Likewise a layer stays
while an image lists it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from typing import Literal
import fcntl

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import TaskError
from farm.sandboxes.views import ViewLayer, mounts_under
from farm.sandboxes.watchdog import disk_usage
from farm.tasks.repos import FileLock
from farm.workspace.prepare import SetupReport


class EnvRecord(BaseModel):
    """What a build produced (or why it failed)."""

    model_config = ConfigDict(frozen=True)

    key: str
    ok: bool
    reason: str = ""
    kind: Literal["env", "base", "instance", "layer", "image"] = Field(
        default="env",
        description="a whole environment (one layer), a base, an instance layer over a base (or over an image), "
        "an image's layer, or an image (its layers and config; no tree of its own)",
    )
    base_key: str = Field(default="", description="an instance: the base it stacks on")
    deleted: list[str] = Field(default_factory=list, description="an instance: paths it removes from its base")
    paths: list[str] = Field(
        default_factory=list, description="a base: what it holds (workdir-relative; git-excluded in its instances)"
    )
    mount: str
    identity: dict = Field(default_factory=dict)
    task_ids: list[str] = Field(default_factory=list, description="the task that built it")
    base_commit: str = ""
    baseline_commit: str = ""
    setup: SetupReport = Field(default_factory=SetupReport)
    build_s: float = 0.0
    built_at: float = 0.0
    size_bytes: int = 0
    backend: str = "local"
    template: str | None = Field(default=None, description="E2B: the template built for this environment")
    layers: list[str] = Field(default_factory=list, description="an image: its layers' keys, top first")
    env: dict[str, str] = Field(
        default_factory=dict, description="an image: the environment its commands start with (its Env, activated)"
    )
    user: str = Field(default="", description="an image: the user its commands run as (its config's User)")
    image: dict = Field(
        default_factory=dict, description="an image or a layer: what was pulled (name, digests, config, notes)"
    )

    def log_tail(self, chars: int = 1500) -> str:
        """The end of the failing setup step's output (the build's log, for the rollout's reason)."""
        for step in reversed(self.setup.steps):
            if not step.ok:
                return (step.stderr_tail.strip() or step.stdout_tail.strip())[-chars:]
        return ""


class EnvEntry(BaseModel):
    record: EnvRecord
    size_bytes: int
    last_used: float
    in_use: bool


class EnvStore:
    def __init__(self, cache_dir: str | Path) -> None:
        self.root = Path(os.path.expanduser(str(cache_dir)))
        self._ok: dict[str, EnvRecord] = {}

    def _ensure_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def tree(self, key: str) -> Path:
        return self.root / key / "tree"

    @property
    def blobs(self) -> Path:
        return self.root / ".blobs"

    def usable(self, rec: EnvRecord) -> bool:
        """Its trees are all on disk (an image: every layer's; an E2B template has none here)."""
        if rec.template:
            return True
        if rec.kind == "image":
            return all(self.tree(k).is_dir() for k in rec.layers)
        return self.tree(rec.key).is_dir()

    def view_layers(self, rec: EnvRecord) -> list[ViewLayer]:
        """The frozen trees a view of ``rec`` stacks, top first (an image: its layers)."""
        if rec.kind != "image":
            return [ViewLayer(path=str(self.tree(rec.key)), deleted=tuple(rec.deleted))]
        out = []
        for key in rec.layers:
            layer = self.record(key)
            if layer is None or not layer.ok:
                raise TaskError(f"image {rec.image.get('name', rec.key)}: its layer {key} is gone from {self.root}")
            out.append(ViewLayer(path=str(self.tree(key)), deleted=tuple(layer.deleted)))
        return out

    def lock(self, key: str, timeout: float) -> FileLock:
        self._ensure_root()
        return FileLock(self.root / ".locks" / f"{key}.lock", timeout)

    # --- records ------------------------------------------------------------------
    def record(self, key: str) -> EnvRecord | None:
        """The published record of ``key`` (None: never built, or removed)."""
        if key in self._ok and (self.root / key / "meta.json").is_file():
            return self._ok[key]
        try:
            rec = EnvRecord.model_validate_json((self.root / key / "meta.json").read_bytes())
        except (OSError, ValueError):
            return None
        if rec.ok:
            self._ok[key] = rec
        return rec

    def staging(self, key: str) -> Path:
        """A fresh directory to build ``key`` in (under ``.build``; removes remnants of
        crashed builds of the same key: the caller holds its lock)."""
        self._ensure_root()
        build = self.root / ".build"
        build.mkdir(exist_ok=True)
        for old in build.glob(f"{key}.*"):
            if not mounts_under(old):
                shutil.rmtree(old, ignore_errors=True)
        path = build / f"{key}.{uuid.uuid4().hex[:8]}"
        path.mkdir()
        return path

    def publish(self, staging: Path, record: EnvRecord) -> EnvRecord:
        """Make ``staging`` (with ``tree/`` if ok) the snapshot of ``record.key``, in one rename."""
        meta = staging / "meta.json"
        with open(meta, "w") as fh:
            fh.write(record.model_dump_json(indent=1))
            fh.flush()
            os.fsync(fh.fileno())
        (staging / "last_used").touch()
        final = self.root / record.key
        if final.exists():  # an earlier failure record (the caller holds the key's lock)
            self._discard(final)
        os.rename(staging, final)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._ok.pop(record.key, None)
        return record

    def touch(self, key: str) -> None:
        try:
            os.utime(self.root / key / "last_used")
        except OSError:
            pass

    # --- management ------------------------------------------------------------------
    def in_use(self, key: str) -> bool:
        """A live sandbox's view has this snapshot among its lower layers: a kernel overlay
        (its options in mountinfo) or a fuse-overlayfs daemon (its command line)."""
        tree = str(self.tree(key))
        try:
            if tree in _lowerdirs(Path("/proc/self/mountinfo").read_text()):
                return True
        except OSError:
            pass
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    cmd = Path(entry.path, "cmdline").read_bytes()
                except OSError:
                    continue
                if b"fuse-overlayfs" in cmd and tree in _lowerdirs(cmd.replace(b"\0", b" ").decode(errors="replace")):
                    return True
        return False

    def dependents(self, key: str) -> list[str]:
        """The records built on ``key``: instances on a base or an image, images on a layer."""
        return [e.record.key for e in self._records() if e.record.base_key == key or key in e.record.layers]

    def blocker(self, key: str) -> str:
        """Why ``key`` must stay ('' when it may go): a live view, or records on it."""
        if self.in_use(key):
            return "in use by a sandbox"
        deps = self.dependents(key)
        if not deps:
            return ""
        rec = self.record(key)
        return f"a layer of {len(deps)} image(s)" if rec is not None and rec.kind == "layer" else \
            f"the base of {len(deps)} instance environment(s)"  # fmt: skip

    def _records(self) -> list[EnvEntry]:
        """Every published record (``in_use`` not looked up)."""
        out = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".") or not d.is_dir():
                continue
            rec = self.record(d.name)
            if rec is None:
                continue
            try:
                last = (d / "last_used").stat().st_mtime
            except OSError:
                last = rec.built_at
            out.append(EnvEntry(record=rec, size_bytes=rec.size_bytes, last_used=last, in_use=False))
        return out

    def entries(self) -> list[EnvEntry]:
        return [e.model_copy(update={"in_use": self.in_use(e.record.key)}) for e in self._records()]

    def remove(self, key: str, *, force: bool = False) -> bool:
        """Remove one snapshot; refuses (False) while a sandbox uses it or instances are
        built on it, unless ``force`` (which removes those instances too)."""
        d = self.root / key
        if not d.is_dir() or (self.blocker(key) and not force):
            return False
        for dep in self.dependents(key):
            self.remove(dep, force=True)
        self._ok.pop(key, None)
        return self._discard(d)

    def _discard(self, d: Path) -> bool:
        """Remove ``d``: False when another remover (a gc of another build, another process)
        took it first."""
        trash = self.root / ".build" / f"trash-{d.name}.{uuid.uuid4().hex[:8]}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(d, trash)  # gone from view at once; then deleted
        except FileNotFoundError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def gc(self, max_size_bytes: int) -> list[str]:
        """Remove least-recently-used snapshots (failures first) until the cache holds at
        most ``max_size_bytes``; snapshots in use stay. Also clears crashed builds."""
        removed = []
        build = self.root / ".build"
        if build.is_dir():
            for old in build.iterdir():
                lock = self.root / ".locks" / f"{old.name.split('.', 1)[0]}.lock"
                if old.name.startswith("trash-") or not _locked(lock):
                    shutil.rmtree(old, ignore_errors=True)
        entries = sorted(self._records(), key=lambda e: (e.record.ok, e.last_used))
        total = sum(e.size_bytes for e in entries)
        progress = True
        while total > max_size_bytes and progress:  # again after a pass: a base whose last instance went
            progress = False
            for e in entries:
                if total <= max_size_bytes:
                    break
                if e.record.key not in removed and self.remove(e.record.key):
                    total -= e.size_bytes
                    removed.append(e.record.key)
                    progress = True
        return removed


def _lowerdirs(text: str) -> set[str]:
    """Every directory named in a ``lowerdir=a:b:c`` option of ``text``."""
    out: set[str] = set()
    for part in text.split("lowerdir=")[1:]:
        value = part.split(",", 1)[0].split(" ", 1)[0].split("\n", 1)[0]
        for path in value.split(":"):
            out.add(path)
            if os.path.islink(path):  # a view with many layers names them by short links (farm.sandboxes.views)
                out.add(os.path.realpath(path))
    return out


def tree_size(path: Path) -> int:
    return disk_usage(str(path))


def _locked(lock: Path) -> bool:
    """Someone holds ``lock`` (a build in progress)."""
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
