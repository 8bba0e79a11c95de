"""A registry v2 client (the OCI distribution API) on aiohttp: manifests and blobs, nothing else.

Why our own and not skopeo or a Python registry library: a blob streams into farm's store
with its sha256 checked as it arrives and resumes with ``Range`` where it stopped (skopeo
and python-dxf restart a blob; oras-py and python-dxf are synchronous ``requests``); every
failure is a typed farm error with the registry's own words; the waits are bounded by
aiohttp's timeouts (a silent registry fails the read, it never hangs); no other program has
to be on every node of a cluster.

Auth, as registries ask for it: a 401 names a scheme in ``WWW-Authenticate``. ``Bearer``
(Docker Hub, most hosted registries): a token from its ``realm`` for ``service`` and the
repository's ``pull`` scope, anonymously or with the credentials docker keeps (an
``identitytoken`` is an OAuth refresh token: POSTed), then the request again with it.
``Basic`` (a plain ``docker-registry`` with htpasswd): the request again with the
credentials. Network errors, 5xx and 429 are retried with backoff (``Retry-After`` when
given); a 404 is an ``ImageNotFound``; a 401/403 after auth a ``RegistryAuthError``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from farm.errors import DigestMismatch, ImageNotFound, RegistryAuthError, RegistryError
from farm.images.auth import Credential
from farm.images.config import ImagesConfig
from farm.images.manifest import ACCEPT, Descriptor

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_AUTH_PARAM = re.compile(r'(\w+)="([^"]*)"')
_LOOPBACK = ("localhost", "127.", "[::1]")


def base_url(registry: str, api_host: str, cfg: ImagesConfig) -> str:
    """Where ``registry``'s API is asked: its mirror's URL, else http for ``insecure`` and
    loopback registries (as docker treats 127.0.0.0/8), else https."""
    mirror = cfg.mirrors.get(registry)
    if mirror:
        return mirror.rstrip("/")
    plain = registry in cfg.insecure or api_host in cfg.insecure or api_host.startswith(_LOOPBACK)
    return f"{'http' if plain else 'https'}://{api_host}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ") if str(exc) else type(exc).__name__


def _registry_message(body: bytes) -> str:
    """The registry's own error text (``{"errors": [{"code", "message"}]}``)."""
    try:
        errors = json.loads(body).get("errors") or []
        return "; ".join(f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors)
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace").strip()


class RegistryClient:
    """One registry (one ``aiohttp`` session); ``close()`` when done."""

    def __init__(
        self, registry: str, url: str, cfg: ImagesConfig, *, credential: Credential | None = None,
        cred_sources: list[str] | None = None,
    ) -> None:
        self.registry = registry
        self.url = url
        self.cfg = cfg
        self._cred = credential
        self._sources = cred_sources or []
        self._tokens: dict[str, str] = {}  # scope -> bearer token
        self._basic = False  # the registry asked for Basic auth
        timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout, headers={"User-Agent": "farm-images"})

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the requests ----------------------------------------------------------------
    async def manifest(self, repository: str, reference: str) -> tuple[str, str, bytes]:
        """(media type, digest, body) of a manifest or index; the body checked against the
        digest when ``reference`` is one (a tag's digest is the registry's header, else ours)."""
        what = f"{self.registry}/{repository}:{reference}" if not reference.startswith("sha256:") else \
            f"{self.registry}/{repository}@{reference}"  # fmt: skip
        url = f"{self.url}/v2/{repository}/manifests/{reference}"
        async with await self._send("GET", url, repository, {"Accept": ACCEPT}, what=what) as resp:
            body = await self._read(resp, what)
            media = resp.headers.get("Content-Type", "").split(";", 1)[0].strip()
            header_digest = resp.headers.get("Docker-Content-Digest", "")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        expected = reference if reference.startswith("sha256:") else ""
        if expected and digest != expected:
            raise DigestMismatch(f"manifest {what}: the registry sent content of digest {digest}")
        if header_digest.startswith("sha256:") and header_digest != digest:
            raise DigestMismatch(f"manifest {what}: the registry says {header_digest} but sent content of {digest}")
        return media, digest, body

    async def blob(self, repository: str, desc: Descriptor, *, max_bytes: int = 64 << 20) -> bytes:
        """A small blob (a config) in memory, checked against its digest."""
        what = f"blob {desc.digest} of {self.registry}/{repository}"
        if desc.size > max_bytes:
            raise RegistryError(f"{what}: {desc.size} bytes, over {max_bytes} for a config")
        url = f"{self.url}/v2/{repository}/blobs/{desc.digest}"
        async with await self._send("GET", url, repository, {}, what=what) as resp:
            body = await self._read(resp, what)
        got = "sha256:" + hashlib.sha256(body).hexdigest()
        if got != desc.digest:
            raise DigestMismatch(f"{what}: downloaded content has digest {got}")
        return body

    async def fetch_blob(
        self, repository: str, desc: Descriptor, dest: Path, *, on_bytes: Callable[[int], None] | None = None,
    ) -> Path:
        """Download a blob to ``dest``, resuming ``dest.part`` where an earlier try stopped,
        its sha256 checked over the whole file before it is renamed into place. A mismatch
        removes the download (``DigestMismatch``); a network failure keeps it for the next try."""
        what = f"blob {desc.digest} of {self.registry}/{repository}"
        if not desc.digest.startswith("sha256:"):
            raise RegistryError(f"{what}: only sha256 digests are supported")
        part = dest.with_name(dest.name + ".part")
        url = f"{self.url}/v2/{repository}/blobs/{desc.digest}"
        hasher, have = _hash_of(part, desc.size)
        last: BaseException | None = None
        for attempt in range(self.cfg.retries + 1):
            if have >= desc.size:
                break
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                async with await self._send("GET", url, repository, headers, what=what) as resp:
                    if resp.status == 416:  # the range is past what the registry holds: start over
                        part.unlink(missing_ok=True)
                        hasher, have = hashlib.sha256(), 0
                        continue
                    if resp.status == 200 and have:  # the server ignored the range: start over
                        hasher, have = hashlib.sha256(), 0
                    mode = "ab" if have else "wb"
                    with open(part, mode) as fh:
                        async for chunk in resp.content.iter_chunked(_CHUNK):
                            if have + len(chunk) > desc.size:
                                raise DigestMismatch(f"{what}: the registry sent more than its {desc.size} bytes")
                            fh.write(chunk)
                            hasher.update(chunk)
                            have += len(chunk)
                            if on_bytes is not None:
                                on_bytes(len(chunk))
                last = None
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
                last = exc
                log.info("%s: download stopped at %d/%d bytes (%s); resuming", what, have, desc.size, _describe(exc))
                await asyncio.sleep(min(2.0**attempt, 30.0))
        if have < desc.size:
            cause = _describe(last) if last else "the registry ended the body early"
            raise RegistryError(f"{what}: download stopped at {have} of {desc.size} bytes after "
                                f"{self.cfg.retries + 1} tries ({cause}); kept to resume")  # fmt: skip
        got = "sha256:" + hasher.hexdigest()
        if got != desc.digest:
            part.unlink(missing_ok=True)
            raise DigestMismatch(f"{what}: the downloaded {desc.size} bytes have digest {got} (corrupt or not what "
                                 "the manifest names); removed, nothing unpacked")  # fmt: skip
        os.replace(part, dest)
        return dest

    # --- plumbing --------------------------------------------------------------------
    async def _read(self, resp: aiohttp.ClientResponse, what: str) -> bytes:
        try:
            return await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RegistryError(f"{what}: reading the registry's answer failed: {_describe(exc)}") from None

    async def _send(
        self, method: str, url: str, repository: str, headers: dict[str, str], *, what: str,
    ) -> aiohttp.ClientResponse:
        """The response (status 200/206) to ``method url``, after auth and retries; every
        other outcome is raised as the farm error it means."""
        scope = f"repository:{repository}:pull"
        authed = False
        attempt = -1
        while attempt < self.cfg.retries:
            attempt += 1
            auth = self._auth_header(scope)
            try:
                resp = await self._session.request(method, url, headers={**headers, **auth}, allow_redirects=True)
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
                if attempt == self.cfg.retries:
                    raise RegistryError(f"{what}: cannot reach registry {self.registry} at {self.url} "
                                        f"({_describe(exc)}; {attempt + 1} tries)") from None  # fmt: skip
                await asyncio.sleep(min(2.0**attempt, 30.0))
                continue
            if resp.status in (200, 206):
                return resp
            body = await resp.read()
            resp.release()
            said = _registry_message(body)
            if resp.status == 401 and not authed:
                authed = True
                await self._authenticate(resp.headers.get("WWW-Authenticate", ""), scope, what)
                attempt -= 1  # the same request again, with the credentials it asked for: not a retry
                continue
            if resp.status in (401, 403):
                raise RegistryAuthError(self._auth_message(resp.status, repository, said))
            if resp.status == 404:
                raise ImageNotFound(f"{what}: not found on registry {self.registry}" + (f" ({said})" if said else ""))
            if resp.status == 416 and "Range" in headers:
                return resp  # nothing left to send (the caller checks the size and digest)
            if resp.status == 429 or resp.status >= 500:
                if attempt == self.cfg.retries:
                    kind = "rate limited (429)" if resp.status == 429 else f"server error {resp.status}"
                    raise RegistryError(f"{what}: registry {self.registry} {kind} after {attempt + 1} tries"
                                        + (f": {said}" if said else ""))  # fmt: skip
                await asyncio.sleep(_retry_after(resp.headers.get("Retry-After"), attempt))
                continue
            raise RegistryError(f"{what}: registry {self.registry} answered {resp.status}" + (f": {said}" if said else ""))
        raise RegistryError(f"{what}: registry {self.registry}: no answer after {self.cfg.retries + 1} tries")

    def _auth_header(self, scope: str) -> dict[str, str]:
        if scope in self._tokens:
            return {"Authorization": f"Bearer {self._tokens[scope]}"}
        if self._basic and self._cred is not None and self._cred.username:
            return {"Authorization": f"Basic {self._cred.basic()}"}
        return {}

    def _auth_message(self, status: int, repository: str, said: str) -> str:
        where = ", ".join(self._sources) or "none configured (FARM_REGISTRY_AUTH, tasks.images.docker_config)"
        if self._cred is None:
            head = (f"registry {self.registry} refused anonymous access to {repository} ({status}): the repository "
                    f"does not exist or needs credentials; credentials searched: {where}")  # fmt: skip
        else:
            head = f"registry {self.registry} refused the credentials for {repository} ({status}) from: {where}"
        return head + (f"; it said: {said}" if said else "")

    async def _authenticate(self, challenge: str, scope: str, what: str) -> None:
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if self._cred is None or not self._cred.username:
                raise RegistryAuthError(self._auth_message(401, scope.split(":")[1], "it asks for a user and password"))
            self._basic = True
            return
        if scheme.lower() != "bearer":
            raise RegistryAuthError(f"{what}: registry {self.registry} asks for unknown auth {challenge!r}")
        fields = dict(_AUTH_PARAM.findall(params))
        realm = fields.get("realm")
        if not realm:
            raise RegistryAuthError(f"{what}: registry {self.registry}'s Bearer challenge names no realm")
        query = {"scope": scope, **({"service": fields["service"]} if "service" in fields else {})}
        try:
            if self._cred is not None and self._cred.identity_token:
                form = {**query, "grant_type": "refresh_token", "refresh_token": self._cred.identity_token,
                        "client_id": "farm"}  # fmt: skip
                resp = await self._session.post(realm, data=form)
            else:
                basic = {"Authorization": f"Basic {self._cred.basic()}"} if self._cred and self._cred.username else {}
                resp = await self._session.get(realm, params=query, headers=basic)
            async with resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RegistryAuthError(self._auth_message(resp.status, scope.split(":")[1],
                                                               f"token service {realm}: {_registry_message(body)}"))
                data = json.loads(body)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RegistryError(f"{what}: the token service {realm} of {self.registry}: {_describe(exc)}") from None
        except ValueError:
            raise RegistryAuthError(f"{what}: the token service {realm} answered no JSON") from None
        token = data.get("token") or data.get("access_token")
        if not token:
            raise RegistryAuthError(f"{what}: the token service {realm} answered without a token")
        self._tokens[scope] = str(token)


def _retry_after(value: str | None, attempt: int) -> float:
    try:
        return min(float(value), 60.0) if value else min(2.0**attempt, 30.0)
    except ValueError:
        return min(2.0**attempt, 30.0)


def _hash_of(part: Path, size: int) -> tuple[Any, int]:
    """The sha256 state and length of an earlier try's download (empty when too long)."""
    hasher = hashlib.sha256()
    try:
        have = part.stat().st_size
    except FileNotFoundError:
        return hasher, 0
    if have > size:
        part.unlink()
        return hasher, 0
    with open(part, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            hasher.update(chunk)
    return hasher, have
