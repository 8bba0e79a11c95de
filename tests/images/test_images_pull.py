"""Pulling from a real registry into the environment store: an index resolved to linux/amd64,
layers unpacked once per node and shared between images, the config recorded, pulls that
resume, and each failure (a missing tag, a refused or unreachable registry, a digest that
does not match, a malformed layer) a precise error that leaves nothing half-made behind."""

from __future__ import annotations

import asyncio
import json
import logging
import base64
from pathlib import Path

import pytest

from farm.envs.provider import EnvBuildFailed
from farm.errors import DigestMismatch, ImageMalformed, ImageNotFound, RegistryAuthError, RegistryError
from testkit.oci import Entry, OciLayout, push, tar_of_entries
from testkit.registry import LocalRegistry, free_port
from tests.images.conftest import image_task

BASE = [Entry("etc", "dir", mode=0o755), Entry("etc/os-release", data=b"ID=farmtest\n"),
        Entry("opt/big.bin", data=bytes(range(256)) * 4096), Entry("var/cache/x", data=b"cache")]  # fmt: skip


def two_images(layout: OciLayout, registry: LocalRegistry, repo: str) -> tuple[str, str]:
    """Two images sharing a base layer (as SWE-bench's instance images share their env's):
    ``a`` is a multi-platform index, ``b`` a Docker schema 2 manifest."""
    base = layout.add_layer(tar_of_entries([*BASE, Entry("etc/repo", data=repo.encode())]))  # no blob shared across tests
    a = layout.add_layer(tar_of_entries([Entry("testbed/a.py", data=b"A = 1\n"), Entry("var/cache/.wh.x")]))
    b = layout.add_layer(tar_of_entries([Entry("testbed/b.py", data=b"B = 2\n"), Entry("etc/.wh..wh..opq"),
                                         Entry("etc/os-release", data=b"ID=b\n")]))  # fmt: skip
    layout.add_image("a", [base, a], env=["PATH=/opt/x/bin:/usr/bin:/bin", "LANG=C.UTF-8"], workdir="/testbed",
                     user="", entrypoint=["/bin/bash"], cmd=["-l"], platforms=["linux/arm64", "linux/amd64"])  # fmt: skip
    layout.add_image("b", [base, b])
    push(layout, "a", f"{registry.host}/{repo}:a", all_platforms=True)
    push(layout, "b", f"{registry.host}/{repo}:b", docker_format=True)
    return f"{registry.host}/{repo}:a", f"{registry.host}/{repo}:b"


def blob_gets(registry: LocalRegistry, repo: str) -> list[str]:
    """Blob downloads from ``repo``."""
    return [p for m, p, status in registry.requests(f"/v2/{repo}/blobs/") if m == "GET" and status in (200, 206)]


async def test_layers_are_unpacked_once_and_shared(registry, layout, provider_for_images, caplog):
    name_a, name_b = two_images(layout, registry, "farm/shared")
    p = provider_for_images(progress_s=0.001)
    q = provider_for_images(progress_s=0.001)  # another process of the node: the store's locks, not its futures
    caplog.set_level(logging.INFO, logger="farm.images")
    # a (twice per process) and, in the other process at the same time, b: the base layer both hold is one lock's
    asks = [(p, name_a), (q, name_a), (p, name_a), (q, name_a), (q, name_b)]
    recs = await asyncio.gather(*(prov.ensure_base(image_task(name, f"t{i}")) for i, (prov, name) in enumerate(asks)))
    assert all(r.ok for r in recs) and len({r.key for r in recs[:4]}) == 1
    img, rec_b = recs[0], recs[4]
    assert img.kind == "image" and len(img.layers) == 2
    cfg = img.image["config"]
    assert (cfg["working_dir"], cfg["entrypoint"], cfg["cmd"]) == ("/testbed", ["/bin/bash"], ["-l"])
    assert img.env == {"PATH": "/opt/x/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # no activation asked
    top, base = (p.store.record(k) for k in img.layers)
    assert top.deleted == ["var/cache/x"] and (p.store.tree(top.key) / "testbed/a.py").read_text() == "A = 1\n"
    assert (p.store.tree(base.key) / "opt/big.bin").stat().st_size == 256 * 4096
    # three layers (the shared base, a's, b's), each fetched and unpacked once for five asks in two processes
    layer_gets = [g for g in blob_gets(registry, "farm/shared") if g.rsplit("/", 1)[1] not in
                  {(await q.resolve_image(n)).manifest.config.digest for n in (name_a, name_b)}]  # fmt: skip
    assert len(layer_gets) == 3, layer_gets
    assert not list((p.store.blobs / "sha256").glob("*.part"))
    assert any("pulling" in r.message for r in caplog.records)  # progress of a long pull
    assert rec_b.layers[1] == base.key  # b's view stacks on the same base tree
    assert p.store.record(rec_b.layers[0]).deleted == ["etc"]  # the opaque directory
    # every layer blob is gone once unpacked; manifests and configs stay (small)
    left = {f.name for f in (p.store.blobs / "sha256").iterdir()}
    assert not {d.split(":")[1] for d in (top.image["digest"], base.image["digest"])} & left


async def test_a_missing_tag_and_repository(registry, layout, provider_for_images):
    p = provider_for_images()
    two_images(layout, registry, "farm/there")
    with pytest.raises(ImageNotFound, match=r"farm/there:nope: not found on registry 127\.0\.0\.1:\d+ \(MANIFEST_UNKNOWN"):
        await p.ensure_base(image_task(f"{registry.host}/farm/there:nope"))
    with pytest.raises(ImageNotFound, match=r"farm/never:v1: not found on registry"):
        await p.ensure_base(image_task(f"{registry.host}/farm/never:v1", "t2"))
    assert p.store.entries() == []


async def test_an_unreachable_registry_fails_fast(provider_for_images):
    p = provider_for_images(retries=1, connect_timeout_s=2)
    port = free_port()  # nothing listens there
    with pytest.raises(RegistryError, match=rf"cannot reach registry 127\.0\.0\.1:{port} .*2 tries"):
        await p.ensure_base(image_task(f"127.0.0.1:{port}/farm/x:v1"))


async def test_a_blob_that_is_not_its_digest(registry, layout, provider_for_images):
    name, _ = two_images(layout, registry, "farm/corrupt")
    p = provider_for_images()
    resolved = await p.resolve_image(name)
    layer = resolved.manifest.layers[1]
    stored = registry.blob_file(layer.digest)
    good = stored.read_bytes()
    stored.write_bytes(good[:-8] + bytes(8))  # same size, other bytes
    try:
        with pytest.raises(DigestMismatch, match=rf"blob {layer.digest} of .*have digest sha256:[0-9a-f]{{64}} .*removed"):
            await p.ensure_base(image_task(name))
    finally:
        stored.write_bytes(good)
    assert [e.record.kind for e in p.store.entries()] == ["layer"]  # the good layer stays; nothing of the bad one
    assert not list((p.store.blobs / "sha256").glob("*.part")) and not list((p.store.root / ".build").iterdir())
    # the registry is repaired: the next rollout gets the image
    assert (await p.ensure_base(image_task(name, "t2"))).ok


async def test_a_malformed_layer_is_the_images_and_recorded_once(registry, layout, provider_for_images):
    not_tar = layout.add_blob(__import__("gzip").compress(b"\x01" * 4096), "application/vnd.oci.image.layer.v1.tar+gzip",
                              diff_id="sha256:" + __import__("hashlib").sha256(b"\x01" * 4096).hexdigest())  # fmt: skip
    layout.add_image("bad", [layout.add_layer(tar_of_entries(BASE)), not_tar])
    push(layout, "bad", f"{registry.host}/farm/bad:v1")
    p = provider_for_images()
    task = image_task(f"{registry.host}/farm/bad:v1")
    rec = await p.ensure_base(task)
    assert not rec.ok and rec.kind == "image" and "not a valid tar stream" in rec.reason
    gets = len(blob_gets(registry, "farm/bad"))
    again = await provider_for_images().ensure_base(image_task(f"{registry.host}/farm/bad:v1", "t2"))
    assert again.reason == rec.reason and len(blob_gets(registry, "farm/bad")) == gets  # read back, not pulled again
    with pytest.raises(EnvBuildFailed, match=r"image .*farm/bad:v1 .*failed to build .*not a valid tar stream"):
        await p.view_for(task)
    assert not list((p.store.root / ".build").iterdir())


async def test_a_download_resumes_where_it_stopped(registry, layout, provider_for_images):
    name, _ = two_images(layout, registry, "farm/resume")
    p = provider_for_images()
    resolved = await p.resolve_image(name)
    big = max(resolved.manifest.layers, key=lambda d: d.size)
    whole = registry.blob_file(big.digest).read_bytes()
    part = p.store.blobs / "sha256" / (big.digest.split(":")[1] + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(whole[: len(whole) // 2])  # an earlier try stopped halfway
    assert (await p.ensure_base(image_task(name))).ok
    ranged = [s for m, path, s in registry.requests(big.digest) if m == "GET"]
    assert ranged == [206]  # only the rest was asked for


async def test_credentials_from_docker_config_and_the_variable(tmp_path: Path, layout, provider_for_images):
    with LocalRegistry(tmp_path / "reg", auth="basic", users={"farm": "s3cret"}) as reg:
        layout.add_image("v1", [layout.add_layer(tar_of_entries(BASE))])
        push(layout, "v1", f"{reg.host}/farm/private:v1", creds="farm:s3cret")
        name = f"{reg.host}/farm/private:v1"
        with pytest.raises(RegistryAuthError, match=r"needs credentials; credentials searched: none configured"):
            await provider_for_images(docker_config=str(tmp_path / "absent.json")).ensure_base(image_task(name))
        wrong = {"auths": {reg.host: {"auth": base64.b64encode(b"farm:wrong").decode()}}}
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps(wrong))
        with pytest.raises(RegistryAuthError, match=rf"refused the credentials for farm/private \(401\) from: {cfg}"):
            await provider_for_images(docker_config=str(cfg)).ensure_base(image_task(name))
        right = json.dumps({"auths": {f"http://{reg.host}/v2/": {"username": "farm", "password": "s3cret"}}})
        assert (await provider_for_images(docker_config=str(cfg), auth=right).ensure_base(image_task(name))).ok


async def test_the_token_flow_of_docker_hub(tmp_path: Path, layout, provider_for_images):
    """A 401 naming a Bearer realm: an anonymous token for public repositories, a token for
    the user's credentials for private ones; the registry checks the token's signature."""
    with LocalRegistry(tmp_path / "reg", auth="token", users={"farm": "pw"}, private={"farm/private"}) as reg:
        layout.add_image("v1", [layout.add_layer(tar_of_entries(BASE))])
        for repo in ("farm/public", "farm/private"):
            push(layout, "v1", f"{reg.host}/{repo}:v1", creds="farm:pw")
        p = provider_for_images(docker_config=None, retries=0)  # the request again with a token is no retry
        assert (await p.ensure_base(image_task(f"{reg.host}/farm/public:v1"))).ok
        assert {"user": "", "scope": "repository:farm/public:pull", "service": "farm-test-registry"} in reg.tokens.requests
        with pytest.raises(RegistryAuthError, match="refused anonymous access to farm/private"):
            await p.ensure_base(image_task(f"{reg.host}/farm/private:v1", "t2"))
        auth = json.dumps({"auths": {reg.host: {"auth": base64.b64encode(b"farm:pw").decode()}}})
        assert (await provider_for_images(docker_config=None, auth=auth).ensure_base(
            image_task(f"{reg.host}/farm/private:v1", "t3"))).ok  # fmt: skip
        assert reg.tokens.requests[-1]["user"] == "farm"


async def test_pull_policy(tmp_path: Path, layout, provider_for_images):
    reg = LocalRegistry(tmp_path / "reg").start()
    try:
        name, _ = two_images(layout, reg, "farm/policy")
        assert (await provider_for_images().ensure_base(image_task(name))).ok
    finally:
        reg.stop()
    # the registry is gone: a name pulled before on this node resolves from the node's copy
    assert (await provider_for_images(pull="missing").ensure_base(image_task(name, "t2"))).ok
    assert (await provider_for_images(pull="never").ensure_base(image_task(name, "t3"))).ok
    with pytest.raises(RegistryError, match="cannot reach registry"):
        await provider_for_images(pull="always", retries=0).ensure_base(image_task(name, "t4"))
    with pytest.raises(ImageNotFound, match="is not on this node and tasks.images.pull is 'never'"):
        await provider_for_images(pull="never").ensure_base(image_task(name.replace(":a", ":other"), "t5"))


async def test_layers_are_evicted_by_the_stores_size_limit(registry, layout, provider_for_images):
    name_a, name_b = two_images(layout, registry, "farm/gc")
    p = provider_for_images()
    a = await p.ensure_base(image_task(name_a))
    await p.ensure_base(image_task(name_b, "tb"))
    assert "a layer of 2 image(s)" == p.store.blocker(a.layers[1])  # both images list the shared layer
    assert p.store.remove(a.layers[1]) is False
    removed = p.store.gc(0)
    assert p.store.entries() == [] and len(removed) == 5  # two images, then their three layers
