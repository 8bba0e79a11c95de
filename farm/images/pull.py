"""Resolving an image name to its manifest and config, and fetching its layers' blobs.

``ImagePuller.resolve(name)``: the name's registry (or its mirror) is asked for the manifest
(an index resolved to ``tasks.images.platform``), then the config; both are kept in the blob
directory by digest, and the tag's digest in ``tags/``, so that with ``pull: missing`` a
name pulled before on this node resolves without the network (``never``: only so;
``always``: the registry is asked once per process). ``fetch(resolved, i)`` downloads layer
``i``'s blob (resumable, checked; ``RegistryClient.fetch_blob``); progress of a long pull
is logged every ``progress_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from farm.errors import ImageMalformed, ImageNotFound
from farm.images.auth import Credentials
from farm.images.config import ImagesConfig
from farm.images.manifest import Descriptor, ImageConfig, Manifest, is_index, parse_config, parse_json, parse_manifest, pick_platform
from farm.images.reference import ImageRef, api_host, parse_ref
from farm.images.registry import RegistryClient, base_url

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedImage:
    """One image for this platform: what its manifest and config say."""

    name: str  # as the task gave it
    ref: ImageRef
    digest: str  # the platform manifest's digest: the image's identity
    manifest: Manifest
    config: ImageConfig

    @property
    def size(self) -> int:
        """Compressed bytes of its layers."""
        return sum(layer.size for layer in self.manifest.layers)


class PullProgress:
    """Bytes of one image's pull, logged every ``every_s`` (and at the end when it took long)."""

    def __init__(self, name: str, total: int, every_s: float) -> None:
        self.name, self.total, self.every_s = name, total, every_s
        self.done = 0
        self._t0 = self._last = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            rate = self.done / max(now - self._t0, 1e-9) / 1e6
            log.info("pulling %s: %.0f of %.0f MB (%.1f MB/s)", self.name, self.done / 1e6, self.total / 1e6, rate)


class ImagePuller:
    """Pulls for one process: a registry client per registry, the node's blob directory."""

    def __init__(self, cfg: ImagesConfig, credentials: Credentials, blob_dir: Path) -> None:
        self.cfg = cfg
        self.credentials = credentials
        self.blob_dir = Path(blob_dir)
        self._clients: dict[str, RegistryClient] = {}
        self._asked: dict[str, ResolvedImage] = {}  # pull: always (one question per process and name)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    def client(self, ref: ImageRef) -> RegistryClient:
        if ref.registry not in self._clients:
            url = base_url(ref.registry, api_host(ref.registry), self.cfg)
            self._clients[ref.registry] = RegistryClient(
                ref.registry, url, self.cfg, credential=self.credentials.for_registry(ref.registry),
                cred_sources=self.credentials.sources,
            )  # fmt: skip
        return self._clients[ref.registry]

    # --- the node's copies ------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.blob_dir / "sha256" / digest.split(":", 1)[1]

    def _tag_path(self, name: str) -> Path:
        return self.blob_dir / "tags" / (hashlib.sha256(name.encode()).hexdigest()[:32] + ".json")

    def _keep(self, digest: str, body: bytes) -> None:
        path = self.blob_path(digest)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(body)
        os.replace(tmp, path)

    def _local(self, name: str, ref: ImageRef) -> ResolvedImage | None:
        """The image ``name`` resolved to when it was pulled on this node (None: never)."""
        try:
            record = json.loads(self._tag_path(str(ref)).read_text())
            manifest_body = self.blob_path(record["digest"]).read_bytes()
            data = parse_json(manifest_body, name)
            manifest = parse_manifest(data, name)
            config = parse_config(self.blob_path(manifest.config.digest).read_bytes(), name, len(manifest.layers))
        except (OSError, ValueError, KeyError, ImageMalformed):
            return None
        return ResolvedImage(name=name, ref=ref, digest=record["digest"], manifest=manifest, config=config)

    # --- resolving --------------------------------------------------------------------
    async def resolve(self, name: str) -> ResolvedImage:
        ref = parse_ref(name, self.cfg.registry)
        if self.cfg.pull != "always" or ref.digest:
            local = self._local(name, ref)
            if local is not None:
                return local
            if self.cfg.pull == "never":
                raise ImageNotFound(f"image {name} is not on this node and tasks.images.pull is 'never'")
        elif str(ref) in self._asked:
            return self._asked[str(ref)]
        resolved = await self._remote(name, ref)
        self._asked[str(ref)] = resolved
        return resolved

    async def _remote(self, name: str, ref: ImageRef) -> ResolvedImage:
        client = self.client(ref)
        media, digest, body = await client.manifest(ref.repository, ref.reference)
        data = parse_json(body, f"manifest of {name}")
        if is_index(media, data):
            desc = pick_platform(data, self.cfg.platform, f"image {name}")
            media, digest, body = await client.manifest(ref.repository, desc.digest)
            data = parse_json(body, f"manifest of {name} ({self.cfg.platform})")
            if is_index(media, data):
                raise ImageMalformed(f"image {name}: its {self.cfg.platform} entry is another index")
        manifest = parse_manifest(data, f"manifest of {name}")
        config_body = await client.blob(ref.repository, manifest.config)
        config = parse_config(config_body, f"config of {name}", len(manifest.layers))
        self._keep(digest, body)
        self._keep(manifest.config.digest, config_body)
        tag = self._tag_path(str(ref))
        tag.parent.mkdir(parents=True, exist_ok=True)
        tmp = tag.with_name(f".{tag.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps({"name": str(ref), "digest": digest, "at": time.time()}))
        os.replace(tmp, tag)
        log.info("image %s is %s (%d layers, %.0f MB compressed)", name, digest[:19], len(manifest.layers),
                 sum(x.size for x in manifest.layers) / 1e6)  # fmt: skip
        return ResolvedImage(name=name, ref=ref, digest=digest, manifest=manifest, config=config)

    async def fetch(self, image: ResolvedImage, layer: Descriptor, progress: PullProgress | None = None) -> Path:
        """The blob of ``layer`` on this node (downloaded when not here yet)."""
        dest = self.blob_path(layer.digest)
        if dest.is_file() and dest.stat().st_size == layer.size:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        return await self.client(image.ref).fetch_blob(image.ref.repository, layer, dest, on_bytes=progress)
