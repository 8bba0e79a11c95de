"""``EnvProvider``: the environment snapshot a sandbox starts from, built on first use.

Rollouts and grading ask for ``view_for(task)``: the environment's key is computed once
per task; a published snapshot is used at once; a missing one is built exactly once
however many rollouts ask together (one build task per key in this process, shielded
from the cancellation of any one waiter; across processes of a node, the key's flock,
after which a process that waited finds the other's snapshot). A failed build is read
back as ``EnvBuildFailed`` (a ``SetupCommandFailed``: the rollout ends ``setup_failed``
with the build's reason and log), never rebuilt per rollout.

A layered task (``base_setup_commands``; on E2B, with a git workspace) needs its base first: built
once per base key the same way, then its instance layer on it. A failed base is read
back for every instance of it (each ends ``setup_failed`` with the base's reason; no
instance is built on it); its view stacks [instance, base].

A task whose workspace is a container image (an image source; local sandboxes) has the
image as its base: the name is resolved to a digest once per process (``tasks.images.pull``
says when the registry is asked), the image is pulled and unpacked once per node
(``farm.envs.image``), and the view stacks [instance, the image's layers...] at ``/`` with
the image's environment.
"""

from __future__ import annotations

import asyncio
import logging

from farm.envs.build import SandboxMaker, build_base, build_env
from farm.envs.config import EnvsConfig
from farm.envs.identity import EnvIdentity, identity_of, image_identity
from farm.envs.store import EnvRecord, EnvStore
from farm.errors import SetupCommandFailed, TaskError
from farm.images.auth import Credentials
from farm.images.pull import ImagePuller, ResolvedImage
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.views import SnapshotView, ViewLayer
from farm.tasks.model import GitSource, ImageSource, Task
from farm.tasks.runtime import TaskRuntime
from farm.envs.e2b_templates import build_e2b_env

log = logging.getLogger(__name__)


class EnvBuildFailed(SetupCommandFailed):
    """The task's environment failed to build (once, recorded): its setup report rides along.
    Deterministic: every later attempt reads the same recorded failure back (until
    ``farm envs rm --failed``)."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message, report, deterministic=True)


class EnvProvider:
    def __init__(
        self, cfg: EnvsConfig, runtime: TaskRuntime, make_sandbox: SandboxMaker, *, labels: dict[str, str] | None = None,
        backend: str = "local", e2b: dict | None = None, registry_auth: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.images_cfg = runtime.config.images
        self._registry_auth = registry_auth  # FARM_REGISTRY_AUTH, as the entry point read it
        self._puller: ImagePuller | None = None
        self._resolving: dict[str, asyncio.Future[ResolvedImage]] = {}
        self._resolved: dict[str, ResolvedImage] = {}  # image key -> the image it is
        self.e2b = dict(e2b or {})  # build_e2b_env's api_key, domain, default_template (and sdk, in tests)
        self.runtime = runtime
        self.store = EnvStore(cfg.cache_dir)
        self.make_sandbox = make_sandbox
        self.labels = {"run_id": "envs", **(labels or {})}
        self._ids: dict[str, EnvIdentity] = {}
        self._builds: dict[str, asyncio.Future[EnvRecord]] = {}
        self.built: list[str] = []  # keys this process built (for the run summary and tests)

    async def identity(self, task: Task) -> EnvIdentity:
        if task.id not in self._ids:
            # E2B layers templates of git workspaces only (a base template is a checkout at its setup commit)
            layered = self.backend == "local" or isinstance(task.workspace, GitSource)
            image = None
            src = task.workspace
            if self.backend == "local" and isinstance(src, ImageSource):
                resolved = await self.resolve_image(src.image)
                image = image_identity(resolved.digest, src.activate, self.images_cfg.platform, self.backend)
                self._resolved[image.key] = resolved
            self._ids[task.id] = await identity_of(
                task, self.runtime, mount_root=self.cfg.mount_root, backend=self.backend, layered=layered, image=image
            )
        return self._ids[task.id]

    @property
    def puller(self) -> ImagePuller:
        if self._puller is None:
            creds = Credentials.load(self.images_cfg.docker_config, self._registry_auth)
            self._puller = ImagePuller(self.images_cfg, creds, self.store.blobs)
        return self._puller

    async def resolve_image(self, name: str) -> ResolvedImage:
        """``name``'s manifest and config, asked once per process however many tasks name it."""
        fut = self._resolving.get(name)
        if fut is None or (fut.done() and fut.exception() is not None):
            fut = asyncio.ensure_future(self.puller.resolve(name))
            self._resolving[name] = fut
        return await asyncio.shield(fut)

    async def close(self) -> None:
        if self._puller is not None:
            await self._puller.close()

    def record(self, key: str) -> EnvRecord:
        rec = self.store.record(key)
        if rec is None:
            raise TaskError(f"environment {key} has no record in {self.store.root} (removed while in use?)")
        return rec

    async def ensure(self, task: Task) -> EnvRecord:
        """The environment's record, building it first if needed (never twice at once). A
        layered task whose base failed gets the base's (failed) record."""
        ident = await self.identity(task)
        base = None
        if ident.base is not None:
            if isinstance(task.workspace, GitSource):
                # The row's own tree first (host-side, cached; its instance needs it anyway): a
                # mirror missing objects of it fails naming the row's base commit, not its base's.
                await self.runtime.repos.workspace_tarball(task.workspace, task.pre_patch)
            base = await self._ensure(task, ident.base, None)
            if not base.ok:
                return base
        return await self._ensure(task, ident, base)

    async def ensure_base(self, task: Task) -> EnvRecord | None:
        """The record of ``task``'s base (built first if needed); None: one layer, no base."""
        ident = await self.identity(task)
        return None if ident.base is None else await self._ensure(task, ident.base, None)

    async def _ensure(self, task: Task, ident: EnvIdentity, base: EnvRecord | None) -> EnvRecord:
        rec = self._published(ident, base)
        if rec is not None:
            return rec
        fut = self._builds.get(ident.key)
        if fut is None:
            fut = asyncio.ensure_future(self._build(task, ident, base))
            self._builds[ident.key] = fut
            fut.add_done_callback(lambda _f, k=ident.key: self._builds.pop(k, None))
        return await asyncio.shield(fut)

    async def settle(self) -> None:
        """Wait for the builds still running (shielded from their waiters' cancellation, a build
        can outlive every rollout that asked for it): published before the event loop closes,
        never cancelled there mid-command."""
        while self._builds:
            await asyncio.gather(*list(self._builds.values()), return_exceptions=True)

    def _published(self, ident: EnvIdentity, base: EnvRecord | None) -> EnvRecord | None:
        """The usable record of ``ident`` (an instance whose base is not the one given,
        e.g. removed and rebuilt since, is not)."""
        rec = self.store.record(ident.key)
        if rec is None or not rec.ok:
            return rec
        if base is not None and (rec.base_key != base.key or rec.built_at < base.built_at):
            return None
        under = self.store.record(rec.base_key) if rec.base_key else None
        if rec.base_key and (under is None or not self.store.usable(under)):
            return None
        return rec if self.store.usable(rec) else None

    async def _build(self, task: Task, ident: EnvIdentity, base: EnvRecord | None) -> EnvRecord:
        async with self.store.lock(ident.key, self.cfg.build_timeout_s):
            rec = self._published(ident, base)  # another process built it while we waited
            if rec is not None:
                return rec
            if self.backend == "e2b":
                rec = await build_e2b_env(task, ident, runtime=self.runtime, store=self.store, base=base, **self.e2b)
            elif ident.is_image:
                # heavy: isal
                from farm.envs.image import build_image

                rec = await build_image(task, ident, image=self._resolved[ident.key], store=self.store,
                                        puller=self.puller, make_sandbox=self.make_sandbox, labels=self.labels,
                                        lock_timeout_s=self.cfg.build_timeout_s)  # fmt: skip
            elif ident.is_base:
                rec = await build_base(task, ident, runtime=self.runtime, store=self.store,
                                       make_sandbox=self.make_sandbox, labels=self.labels)  # fmt: skip
            else:
                rec = await build_env(task, ident, runtime=self.runtime, store=self.store,
                                      make_sandbox=self.make_sandbox, labels=self.labels, base=base)  # fmt: skip
            self.built.append(ident.key)
        if rec.ok and self.cfg.max_size_bytes is not None:
            removed = await asyncio.to_thread(self.store.gc, self.cfg.max_size_bytes)
            if removed:
                log.info("envs: removed %d least-recently-used snapshot(s) to fit envs.max_size_bytes", len(removed))
        return rec

    async def view_for(self, task: Task) -> SnapshotView:
        """The private view a sandbox for ``task`` starts from; ``EnvBuildFailed`` when its
        environment (or its base) cannot be built."""
        rec = await self.ensure(task)
        if not rec.ok:
            tail = rec.log_tail()
            what = {"base": "base environment", "image": f"image {rec.image.get('name', '')}"}.get(rec.kind, "environment")
            raise EnvBuildFailed(
                f"task {task.id}: {what} {rec.key[:12]} failed to build (once, for task {rec.task_ids[0]}; "
                f"`farm envs rm --failed` to retry): {rec.reason}" + (f"; log: {tail}" if tail else ""),
                report=rec.setup,
            )
        self.store.touch(rec.key)
        if rec.template:
            return SnapshotView(key=rec.key, mount=rec.mount, template=rec.template)
        layers = [ViewLayer(path=str(self.store.tree(rec.key)), deleted=tuple(rec.deleted))]
        env: dict[str, str] = {}
        user = ""
        if rec.base_key:
            base = self.record(rec.base_key)
            for key in (base.key, *base.layers):
                self.store.touch(key)
            layers += self.store.view_layers(base)
            env, user = base.env, base.user
        return SnapshotView(key=rec.key, layers=tuple(layers), mount=rec.mount, env=env, user=user)


def provider_for(
    cfg: EnvsConfig, sandbox: SandboxConfig, runtime: TaskRuntime, make_sandbox: SandboxMaker,
    *, e2b_api_key: str | None = None, registry_auth: str | None = None,
) -> EnvProvider | None:
    """The provider when ``envs.enabled`` and the backend starts sandboxes from snapshots
    (local with bwrap: overlay views; E2B: a template per environment, when
    ``envs.e2b_templates``); None otherwise (every sandbox materializes and sets up itself)."""
    if not cfg.enabled:
        runtime.no_images = "envs.enabled is false"
        return None
    if sandbox.backend == "e2b":
        if not cfg.e2b_templates:
            return None
        e2b = {"api_key": e2b_api_key, "domain": sandbox.e2b.domain, "default_template": sandbox.e2b.template}
        return EnvProvider(cfg, runtime, make_sandbox, backend="e2b", e2b=e2b)
    if sandbox.local.isolation != "bwrap":
        log.info("envs: snapshots need sandbox.local.isolation bwrap; setup runs per sandbox")
        runtime.no_images = "sandbox.local.isolation is not bwrap"
        return None
    return EnvProvider(cfg, runtime, make_sandbox, registry_auth=registry_auth)
