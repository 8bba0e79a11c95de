"""Image references as docker reads them: ``[registry/]repository[:tag][@digest]``.

``ubuntu`` is ``docker.io/library/ubuntu:latest``; a first component with a ``.`` or a ``:``,
or ``localhost``, is a registry (``127.0.0.1:5000/demo/img:v1``). Docker Hub's API lives at
``registry-1.docker.io``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from farm.errors import ImageMalformed

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_REPO = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What the registry's manifest endpoint is asked for: the digest, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_ref(name: str, default_registry: str = DOCKER_HUB) -> ImageRef:
    """``name`` as an ImageRef; ``ImageMalformed`` naming what is wrong."""
    text = name.strip()
    if not text:
        raise ImageMalformed("an empty image name")
    digest = None
    if "@" in text:
        text, digest = text.split("@", 1)
        if not _DIGEST.match(digest):
            raise ImageMalformed(f"image {name!r}: {digest!r} is not a sha256 digest")
    first, _, rest = text.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = default_registry, text
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
        if not _TAG.match(tag):
            raise ImageMalformed(f"image {name!r}: bad tag {tag!r}")
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _REPO.match(path):
        raise ImageMalformed(f"image {name!r}: bad repository name {path!r} (lower case, digits, . _ - and /)")
    if tag is None and digest is None:
        tag = "latest"
    return ImageRef(registry=registry, repository=path, tag=tag, digest=digest)


def api_host(registry: str) -> str:
    """The host serving ``registry``'s v2 API."""
    return DOCKER_HUB_API if registry in (DOCKER_HUB, "index.docker.io") else registry
