"""Image manifests, indexes and configs (OCI image spec 1.x and Docker's schema 2), as data.

An index (OCI ``image.index``, Docker's ``manifest.list``) lists one manifest per platform:
``pick_platform`` takes the configured one (``linux/amd64``). A manifest names the config
blob and the layer blobs (bottom first). The config holds ``rootfs.diff_ids`` (the sha256
of each layer's *uncompressed* tar: what an unpacked layer is keyed and checked by) and the
runtime settings farm keeps: ``Env``, ``WorkingDir``, ``User``, ``Entrypoint``, ``Cmd``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farm.errors import ImageMalformed

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*MANIFEST_TYPES, *INDEX_TYPES))

# layer media type -> compression ("" = a plain tar)
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": "",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar": "",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}


class Descriptor(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    media_type: str = Field(default="", alias="mediaType")
    digest: str
    size: int = Field(ge=0)
    platform: dict[str, Any] | None = None
    urls: list[str] | None = None


class Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_version: int = Field(alias="schemaVersion")
    media_type: str = Field(default="", alias="mediaType")
    config: Descriptor
    layers: list[Descriptor]


class Index(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_version: int = Field(alias="schemaVersion")
    media_type: str = Field(default="", alias="mediaType")
    manifests: list[Descriptor]


class ImageConfig(BaseModel):
    """What farm keeps of an image's config: how its processes are meant to start."""

    model_config = ConfigDict(frozen=True)

    env: dict[str, str] = Field(default_factory=dict, description="Env, as a mapping (later entries win)")
    working_dir: str = ""
    user: str = ""
    entrypoint: list[str] = Field(default_factory=list)
    cmd: list[str] = Field(default_factory=list)
    diff_ids: list[str] = Field(default_factory=list, description="sha256 of each layer's uncompressed tar, bottom first")
    architecture: str = ""
    os: str = ""


def parse_json(body: bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImageMalformed(f"{what}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ImageMalformed(f"{what}: expected a JSON object")
    return data


def is_index(media_type: str, data: dict[str, Any]) -> bool:
    """An index by its media type, or (registries that send none) by holding ``manifests``."""
    return media_type in INDEX_TYPES or data.get("mediaType") in INDEX_TYPES or (
        "manifests" in data and "layers" not in data
    )


def parse_manifest(data: dict[str, Any], what: str) -> Manifest:
    if data.get("schemaVersion") == 1:
        raise ImageMalformed(f"{what}: a Docker schema 1 manifest (deprecated; push the image again with a "
                             "current docker or skopeo)")  # fmt: skip
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        raise ImageMalformed(f"{what}: not an image manifest: {exc.errors()[0]['msg']} at "
                             f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}") from None  # fmt: skip
    for layer in manifest.layers:
        if layer.media_type and layer.media_type not in LAYER_TYPES:
            raise ImageMalformed(f"{what}: layer {layer.digest[:19]} has media type {layer.media_type!r}, not an "
                                 "image layer farm can unpack (tar, tar+gzip, tar+zstd)")  # fmt: skip
    return manifest


def pick_platform(data: dict[str, Any], platform: str, what: str) -> Descriptor:
    """The manifest of ``platform`` (``os/arch[/variant]``) in an index."""
    try:
        index = Index.model_validate(data)
    except ValidationError as exc:
        raise ImageMalformed(f"{what}: not an image index: {exc.errors()[0]['msg']}") from None
    want = platform.split("/")
    offered = []
    for desc in index.manifests:
        p = desc.platform or {}
        have = [str(p.get("os", "")), str(p.get("architecture", ""))] + ([str(p["variant"])] if p.get("variant") else [])
        offered.append("/".join(have))
        if have[:2] == want[:2] and (len(want) < 3 or have[2:3] == want[2:3]):
            return desc
    raise ImageMalformed(f"{what}: no {platform} image in its index (it has: {', '.join(offered) or 'none'}; "
                         "tasks.images.platform picks one)")  # fmt: skip


def parse_config(body: bytes, what: str, layers: int) -> ImageConfig:
    data = parse_json(body, what)
    cfg = data.get("config") or {}
    rootfs = data.get("rootfs") or {}
    diff_ids = rootfs.get("diff_ids") or []
    if not isinstance(diff_ids, list) or len(diff_ids) != layers:
        raise ImageMalformed(f"{what}: rootfs.diff_ids lists {len(diff_ids) if isinstance(diff_ids, list) else 0} "
                             f"layers, the manifest {layers}")  # fmt: skip
    env: dict[str, str] = {}
    for item in cfg.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep and key:
            env[key] = value
    return ImageConfig(
        env=env,
        working_dir=str(cfg.get("WorkingDir") or ""),
        user=str(cfg.get("User") or ""),
        entrypoint=[str(x) for x in cfg.get("Entrypoint") or []],
        cmd=[str(x) for x in cfg.get("Cmd") or []],
        diff_ids=[str(d) for d in diff_ids],
        architecture=str(data.get("architecture", "")),
        os=str(data.get("os", "")),
    )
