"""Writing images in the OCI image layout (image-spec 1.1), for the tests and the benchmark.

``OciLayout(dir)`` is a standard layout (``oci-layout``, ``index.json``, ``blobs/sha256/``)
that ``skopeo copy oci:<dir>:<tag> docker://...`` pushes to any registry; ``layer_from_tree``
and ``layer_from_entries`` make gzip (or plain) tar layers, the latter with what a tree
cannot hold as is (OCI whiteouts, hard links, device nodes). Layers are deterministic for
the same content (fixed owner, the files' own mtimes), so images built alike share blobs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from farm.images.manifest import OCI_INDEX, OCI_MANIFEST

LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    media_type: str
    diff_id: str = ""  # a layer: the sha256 of its uncompressed tar


@dataclass
class Entry:
    """One tar entry: ``kind`` file, dir, symlink, hardlink, chardev, fifo."""

    name: str
    kind: str = "file"
    data: bytes = b""
    mode: int = 0o644
    link: str = ""
    mtime: int = 1_700_000_000


def _info(e: Entry) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(e.name)
    ti.mode, ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = e.mode, e.mtime, 0, 0, "root", "root"
    ti.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
               "chardev": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[e.kind]  # fmt: skip
    ti.linkname = e.link
    ti.size = len(e.data) if e.kind == "file" else 0
    if e.kind == "chardev":
        ti.devmajor, ti.devminor = 1, 3
    return ti


def tar_of_entries(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            tar.addfile(_info(e), io.BytesIO(e.data) if e.kind == "file" else None)
    return buf.getvalue()


def tar_of_tree(root: Path, prefix: str = "") -> bytes:
    """A tree as a tar (sorted, owner root, the files' own modes and mtimes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            names = sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))])
            if rel_dir != ".":
                tar.add(dirpath, arcname=os.path.join(prefix, rel_dir), recursive=False, filter=_root_owned)
            for name in names:
                full = os.path.join(dirpath, name)
                arc = os.path.join(prefix, name if rel_dir == "." else os.path.join(rel_dir, name))
                tar.add(full, arcname=arc, recursive=False, filter=_root_owned)
    return buf.getvalue()


def _root_owned(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    return ti


@dataclass
class OciLayout:
    """A directory in the OCI image layout; ``add_image`` tags images in its index."""

    root: Path
    _index: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        index = self.root / "index.json"
        self._index = json.loads(index.read_text()) if index.is_file() else {"schemaVersion": 2, "manifests": []}

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.split(":", 1)[1]

    def add_blob(self, data: bytes, media_type: str, diff_id: str = "") -> Blob:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        path = self.blob_path(digest)
        if not path.exists():
            path.write_bytes(data)
        return Blob(digest=digest, size=len(data), media_type=media_type, diff_id=diff_id)

    def add_layer(self, tar: bytes, *, compress: bool = True) -> Blob:
        diff_id = "sha256:" + hashlib.sha256(tar).hexdigest()
        data = gzip.compress(tar, compresslevel=1, mtime=0) if compress else tar
        return self.add_blob(data, LAYER_GZIP if compress else LAYER_TAR, diff_id)

    def add_image(
        self, tag: str, layers: list[Blob], *, env: list[str] | None = None, workdir: str = "", user: str = "",
        entrypoint: list[str] | None = None, cmd: list[str] | None = None, platforms: list[str] | None = None,
    ) -> str:
        """Tag an image of ``layers`` (bottom first); returns its manifest's digest. With
        ``platforms`` the tag names an index of that many manifests (only linux/amd64 has
        these layers; the others are the same image under another name, as indexes go)."""
        config = {
            "architecture": "amd64", "os": "linux",
            "config": {"Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                       "WorkingDir": workdir, "User": user, "Entrypoint": entrypoint, "Cmd": cmd},
            "rootfs": {"type": "layers", "diff_ids": [b.diff_id for b in layers]},
        }  # fmt: skip
        cfg = self.add_blob(json.dumps(config, sort_keys=True).encode(), CONFIG)
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": CONFIG, "digest": cfg.digest, "size": cfg.size},
            "layers": [{"mediaType": b.media_type, "digest": b.digest, "size": b.size} for b in layers],
        }  # fmt: skip
        man = self.add_blob(json.dumps(manifest).encode(), manifest["mediaType"])
        top = {"mediaType": man.media_type, "digest": man.digest, "size": man.size}
        if platforms:
            entries = []
            for plat in platforms:
                os_, arch = plat.split("/")[:2]
                entries.append({**top, "platform": {"os": os_, "architecture": arch}})
            idx = self.add_blob(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode(),
                                OCI_INDEX)  # fmt: skip
            top = {"mediaType": OCI_INDEX, "digest": idx.digest, "size": idx.size}
        self._index["manifests"] = [m for m in self._index["manifests"]
                                    if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
        self._index["manifests"].append({**top, "annotations": {"org.opencontainers.image.ref.name": tag}})
        (self.root / "index.json").write_text(json.dumps(self._index))
        return top["digest"]


def push(
    layout: OciLayout, tag: str, dest: str, *, creds: str | None = None, all_platforms: bool = False,
    docker_format: bool = False,
) -> None:
    """``skopeo copy`` the image ``tag`` of ``layout`` to ``dest`` (``host:port/repo:tag``,
    plain HTTP): the real client pushing a standard layout to the real registry.
    ``docker_format``: skopeo converts it to Docker's schema 2 (new manifest digest)."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise RuntimeError("skopeo is not installed (apt-get install skopeo; scripts/setup.sh does)")
    argv = [skopeo, "--insecure-policy", "copy", "-q", "--dest-tls-verify=false"]
    argv += ["--format", "v2s2"] if docker_format else ["--preserve-digests"]
    if all_platforms:
        argv.append("--all")
    if creds:
        argv += ["--dest-creds", creds]
    argv += [f"oci:{layout.root}:{tag}", f"docker://{dest}"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"skopeo copy to {dest} failed: {res.stderr.strip()[-1000:]}")
