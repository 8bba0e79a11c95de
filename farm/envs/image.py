"""A container image as an environment source: pulled, its layers unpacked once per node into
the store, its config and activated environment recorded (``farm.images`` does the pulling
and the unpacking; this module decides what is stored and when).

``build_image`` (the provider holds the image record's lock) publishes, in order:

1. each **layer** not yet in the store, as its own record (kind ``layer``, keyed by the
   layer's uncompressed digest: images that share a layer share its tree): its blob fetched
   (resumable, checked), unpacked into a staging directory (``farm.images.unpack``),
   published in one rename, the blob removed; under the layer's own lock, so two images (or
   two processes) that need one layer at once unpack it once;
2. the **image** (kind ``image``, keyed by its manifest digest and its activation): its
   layers top first, its config (``Env``, ``WorkingDir``, ``User``, ``Entrypoint``,
   ``Cmd``), and the environment its commands start with: the ``Env``, then what the
   dataset's activation leaves (``source /opt/miniconda3/bin/activate && conda activate
   testbed``), captured once in a sandbox on the image.

A layer that is not what the image says (a malformed tar, a wrong diff_id) or an
activation that fails is the image's own: published as a failed image record, read back by
every rollout of it (``farm envs rm --failed`` to try again). A registry that refuses, a
network that fails or a blob whose digest is wrong raises and publishes nothing: a later
rollout tries again (a partial blob download is resumed).
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import shutil
import time
from pathlib import Path

from farm.envs.identity import EnvIdentity
from farm.envs.store import EnvRecord, EnvStore, tree_size
from farm.errors import ImageMalformed, SandboxError
from farm.images.manifest import LAYER_TYPES, Descriptor
from farm.images.pull import ImagePuller, PullProgress, ResolvedImage
from farm.images.unpack import unpack_layer
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.views import SnapshotView
from farm.tasks.model import ImageSource, Task

log = logging.getLogger(__name__)

# what a sandbox sets itself: never part of an image's recorded environment
_SANDBOX_OWN = frozenset({"HOME", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_", "FARM_SANDBOX_ID", "LANG"})


def layer_key(diff_id: str) -> str:
    return "l" + diff_id.split(":", 1)[-1][:31]


async def build_image(
    task: Task, ident: EnvIdentity, *, image: ResolvedImage, store: EnvStore, puller: ImagePuller,
    make_sandbox, labels: dict[str, str], lock_timeout_s: float,  # noqa: ANN001 - SandboxMaker (no cycle)
) -> EnvRecord:
    """Publish ``ident`` (an image's record: the caller holds its lock) and its layers."""
    src = task.workspace
    assert isinstance(src, ImageSource)
    t0 = time.monotonic()
    common = {"key": ident.key, "kind": "image", "mount": "/", "identity": ident.fields, "task_ids": [task.id]}
    info = {"name": src.image, "digest": image.digest, "config": image.config.model_dump(),
            "compressed_bytes": image.size, "layers": len(image.manifest.layers)}  # fmt: skip
    progress = PullProgress(src.image, image.size, puller.cfg.progress_s)
    results = await ensure_layers(image, store=store, puller=puller, progress=progress, lock_timeout_s=lock_timeout_s)
    failures = [r for r in results if isinstance(r, BaseException)]
    malformed = [f for f in failures if isinstance(f, ImageMalformed)]
    if malformed:
        return _publish(store, EnvRecord(**common, ok=False, reason=str(malformed[0]), image=info,
                                         build_s=time.monotonic() - t0, built_at=time.time()))  # fmt: skip
    if failures:
        raise failures[0]
    keys = [r for r in results if isinstance(r, str)]
    layers = list(reversed(keys))  # top first, as views stack them
    env = dict(image.config.env)
    if src.activate:
        view = SnapshotView(key=ident.key, layers=tuple(store.view_layers(EnvRecord(**common, ok=True, layers=layers))),
                            mount="/", env=env, user=image.config.user)  # fmt: skip
        activated, why = await _activated_env(task, view, src.activate, make_sandbox, labels)
        if activated is None:
            return _publish(store, EnvRecord(**common, ok=False, reason=why, layers=layers, image=info,
                                             build_s=time.monotonic() - t0, built_at=time.time()))  # fmt: skip
        env = activated
    rec = EnvRecord(**common, ok=True, layers=layers, env=env, user=image.config.user, image=info,
                    build_s=time.monotonic() - t0, built_at=time.time())  # fmt: skip
    log.info("image %s ready (%d layers, %.0f MB pulled) in %.1f s", src.image, len(layers), progress.done / 1e6,
             rec.build_s)  # fmt: skip
    return _publish(store, rec)


async def ensure_layers(
    image: ResolvedImage, *, store: EnvStore, puller: ImagePuller, progress: PullProgress | None = None,
    lock_timeout_s: float,
) -> list[str | BaseException]:
    """Every layer of ``image`` in the store (fetched and unpacked where missing), bottom first:
    its key, or what failed it. Layers are fetched and unpacked at once (``images.concurrency``
    at a time), each to its end: a layer that failed does not throw away the others' work."""
    progress = progress or PullProgress(image.name, image.size, puller.cfg.progress_s)
    turns = asyncio.Semaphore(puller.cfg.concurrency)
    return await asyncio.gather(*(
        _ensure_layer(image, desc, diff_id, store=store, puller=puller, progress=progress, turns=turns,
                      lock_timeout_s=lock_timeout_s)
        for desc, diff_id in zip(image.manifest.layers, image.config.diff_ids)
    ), return_exceptions=True)  # fmt: skip


def _publish(store: EnvStore, record: EnvRecord) -> EnvRecord:
    staging = store.staging(record.key)
    return store.publish(staging, record)


async def _ensure_layer(
    image: ResolvedImage, desc: Descriptor, diff_id: str, *, store: EnvStore, puller: ImagePuller,
    progress: PullProgress, turns: asyncio.Semaphore, lock_timeout_s: float,
) -> str:
    key = layer_key(diff_id)
    rec = store.record(key)
    if rec is not None and rec.ok and store.usable(rec):
        store.touch(key)
        return key
    async with turns, store.lock(key, lock_timeout_s):
        rec = store.record(key)  # another process unpacked it while we waited
        if rec is not None and rec.ok and store.usable(rec):
            return key
        what = f"layer {desc.digest[:19]} of {image.name}"
        compression = LAYER_TYPES.get(desc.media_type, "gzip")
        t0 = time.monotonic()
        blob = await puller.fetch(image, desc, progress)
        staging = store.staging(key)
        tree = staging / "tree"
        tree.mkdir()
        try:
            report = await asyncio.to_thread(_unpack, blob, compression, tree, what, diff_id)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if report.skipped:
            log.info("%s: skipped %d entries: %s", what, len(report.skipped), "; ".join(report.skipped[:5]))
        size = await asyncio.to_thread(tree_size, tree)
        record = EnvRecord(
            key=key, ok=True, kind="layer", mount="/", deleted=report.deleted, size_bytes=size,
            identity={"diff_id": diff_id}, task_ids=[image.name],
            image={"digest": desc.digest, "diff_id": diff_id, "media_type": desc.media_type, "files": report.files,
                   "tar_bytes": report.tar_bytes, "skipped": report.skipped, "xattrs_dropped": report.xattrs_dropped},
            build_s=time.monotonic() - t0, built_at=time.time(),
        )  # fmt: skip
        store.publish(staging, record)
        blob.unlink(missing_ok=True)  # the tree is the layer now
        return key


def _unpack(blob: Path, compression: str, tree: Path, what: str, diff_id: str):  # noqa: ANN202 - LayerReport
    with open(blob, "rb") as fh:
        return unpack_layer(fh, compression, tree, what=what, diff_id=diff_id)


_CAPTURE = """exec 3>&1 >"$FARM_ACTIVATE_LOG" 2>&1 </dev/null
{activate}
rc=$?
[ $rc -eq 0 ] || exit $rc
env -0 >&3 2>/dev/null || cat /proc/self/environ >&3
"""


async def _activated_env(
    task: Task, view: SnapshotView, activate: str, make_sandbox, labels: dict[str, str],  # noqa: ANN001
) -> tuple[dict[str, str] | None, str]:
    """The environment ``activate`` leaves in the image (None and why, when it fails)."""
    spec = SandboxSpec(labels={**labels, "task_id": task.id, "purpose": "env-build"}, view=view,
                       timeout_s=task.timeouts.setup_s + 120)  # fmt: skip
    sandbox = await make_sandbox(spec)
    try:
        log_path = f"{sandbox.root}/.farm/activate.log"
        script = _CAPTURE.format(activate=activate)
        res = await sandbox.exec(["bash", "-c", f"mkdir -p {shlex.quote(sandbox.root)}/.farm && {script}"],
                                 env={"FARM_ACTIVATE_LOG": log_path}, timeout=task.timeouts.setup_s)  # fmt: skip
        if res.exit_code != 0:
            try:
                said = (await sandbox.read_tail(log_path, 1500)).decode(errors="replace").strip()
            except SandboxError:
                said = ""
            said = said or res.stderr.strip()[-1500:]
            return None, f"the image's activation {activate!r} failed (exit {res.exit_code}): {said}"
    finally:
        await sandbox.close()
    env = {}
    for item in res.stdout.split("\0"):
        key, sep, value = item.partition("=")
        if sep and key and key not in _SANDBOX_OWN and key != "FARM_ACTIVATE_LOG":
            env[key] = value
    if "PATH" not in env:
        return None, f"the image's activation {activate!r} left no PATH (its output: {res.stdout[:300]!r})"
    return env, ""
