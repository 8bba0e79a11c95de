"""A sandbox whose root is an image's file system: the coding-agent CLIs run from the host on
their own loader and libraries (an image with no C library at all here: static busybox), the
commands in the image's environment, farm's jail as for every local sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from farm.harnesses import make_harness
from farm.harnesses.config import HarnessConfig
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.hostrt import RT_MOUNT
from farm.sandboxes.views import SnapshotView
from testkit.oci import Entry, push, tar_of_entries
from tests.images.conftest import image_task

BUSYBOX = "/bin/busybox"
APPLETS = ("sh", "true", "test", "env", "cat", "echo", "id", "ls", "ps", "wget", "nc")


def busybox_layer() -> bytes:
    entries = [Entry(d, "dir", mode=m) for d, m in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777), ("root", 0o700),
                                                     ("proc", 0o555), ("dev", 0o755))]  # fmt: skip
    entries.append(Entry("bin/busybox", data=open(BUSYBOX, "rb").read(), mode=0o755))
    entries += [Entry(f"bin/{a}", "symlink", link="busybox") for a in APPLETS]
    entries += [Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n"), Entry("etc/group", data=b"root:x:0:\n")]
    return tar_of_entries(entries)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(BUSYBOX), reason="busybox-static is not installed (scripts/setup.sh installs it)")
async def test_the_clis_run_on_an_image_without_a_c_library(registry, layout, provider_for_images, tmp_path):
    layout.add_image("v1", [layout.add_layer(busybox_layer())], env=["PATH=/bin", "IMAGE_SAYS=hello"])
    push(layout, "v1", f"{registry.host}/farm/busybox:v1")
    provider = provider_for_images()
    rec = await provider.ensure_base(image_task(f"{registry.host}/farm/busybox:v1"))
    assert rec.ok and rec.env == {"PATH": "/bin", "IMAGE_SAYS": "hello"}
    harnesses = [make_harness(HarnessConfig(name=n)) for n in ("claude_code", "codex", "opencode")]
    clis = [str(await h.install()) for h in harnesses]
    view = SnapshotView(key=rec.key, layers=tuple(provider.store.view_layers(rec)), mount="/", env=rec.env)
    cfg = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb")))  # the node's relinked CLIs, made once
    async with await create_sandbox(cfg, SandboxSpec(view=view, host_programs=clis, labels={"run_id": "img"})) as sb:
        no_libc = await sb.exec(["sh", "-c", "ls /lib /lib64 /usr/lib 2>&1; echo $PATH $IMAGE_SAYS; id -u"])
        assert "No such file" in no_libc.stdout and "/bin hello\n0" in no_libc.stdout  # the image's env, its root
        for harness, host_cli in zip(harnesses, clis):
            inside = await harness.provision(sb)
            assert inside.startswith(f"{RT_MOUNT}/bin/") and inside.endswith(os.path.basename(host_cli))
            res = await sb.exec([inside, "--version"], env={"HOME": "/tmp"}, timeout=120)
            assert res.exit_code == 0 and harness.package.version in res.stdout, (harness.name, res)
        # farm's own file calls: the sandbox's root is its own directory; elsewhere, the image's view (its upper)
        await sb.write_file(f"{sb.root}/.farm/note", "mine")
        await sb.write_file("/etc/farm-note", "in the image")
        both = await sb.exec(["sh", "-c", f"cat {sb.root}/.farm/note /etc/farm-note"])
        assert both.stdout == "minein the image" and await sb.read_file("/etc/farm-note") == b"in the image"
        # what the CLI's tools run is the image's (nothing of farm's loader leaks into their environment)
        env = await sb.exec(["env"])
        assert "LD_LIBRARY_PATH" not in env.stdout and "/.farm" not in env.stdout
        # farm's jail, unchanged: no host file system, its own network after the latch, the cgroup's limits
        host = await sb.exec(["sh", "-c", f"ls {sys.prefix} {os.path.expanduser('~')}/.cache 2>&1; ls /"])
        assert "No such file" in host.stdout and "busybox" not in host.stdout.split("No such file")[-1]
        await sb.isolate_network()
        net = await sb.exec(["sh", "-c", "cat /proc/net/dev | wc -l; wget -q -T 2 -O- http://127.0.0.1:1/ 2>&1; echo rc=$?"])
        assert net.stdout.splitlines()[0].strip() == "3" and "rc=0" not in net.stdout  # loopback only
        # the one forwarded port (the gateway's way in), relayed by farm's relinked socat
        sock = await sb.forward_port(18080)

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 15\r\n\r\nhello from host")
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(answer, path=sock)
        try:
            # (busybox's nc: its static wget resolves names through glibc's NSS, which crashes where no libc is)
            got = await sb.exec(["sh", "-c", "(printf 'GET / HTTP/1.0\\r\\n\\r\\n'; sleep 2) | nc 127.0.0.1 18080"],
                                timeout=60)  # fmt: skip
        finally:
            server.close()
        assert got.stdout.endswith("hello from host"), got
        assert "cgroup" in sb.limits_policy["enforced_by"] or "rlimits" in sb.limits_policy["enforced_by"]
    assert not list((tmp_path / "sb").glob("img/*"))
    assert shutil.disk_usage(tmp_path).free > 0


NO_USERNS = """
import asyncio, json, sys
from farm.errors import SandboxError
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.views import SnapshotView

async def main():
    view = SnapshotView.model_validate_json(sys.argv[1])
    for unshare_user in (True, False):
        cfg = SandboxConfig(local=LocalSandboxConfig(base_dir=sys.argv[2], unshare_user=unshare_user))
        try:
            async with await create_sandbox(cfg, SandboxSpec(view=view, labels={"run_id": "nouserns"})) as sb:
                res = await sb.exec(["sh", "-c", "echo $IMAGE_SAYS; ls /bin/busybox"])
                print(json.dumps([unshare_user, "ok", res.stdout]))
        except SandboxError as exc:
            print(json.dumps([unshare_user, "error", str(exc)]))

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(BUSYBOX) or shutil.which("unshare") is None, reason="busybox-static, unshare")
async def test_where_user_namespaces_are_disabled(registry, layout, provider_for_images, tmp_path):
    """Inside a user namespace of ours whose ``max_user_namespaces`` is 0 (what a host with
    unprivileged user namespaces disabled gives: bwrap cannot make its own), an image sandbox
    fails to create with the reason and the way out; with ``unshare_user: false`` and the
    capabilities of the namespace farm runs in (a privileged pod), it runs in the image."""
    layout.add_image("v1", [layout.add_layer(busybox_layer())], env=["PATH=/bin", "IMAGE_SAYS=hello"])
    push(layout, "v1", f"{registry.host}/farm/busybox:nouserns")
    provider = provider_for_images()
    rec = await provider.ensure_base(image_task(f"{registry.host}/farm/busybox:nouserns"))
    view = SnapshotView(key=rec.key, layers=tuple(provider.store.view_layers(rec)), mount="/", env=rec.env)
    script = tmp_path / "nouserns.py"
    script.write_text(NO_USERNS)
    inner = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} {script} '{view.model_dump_json()}' {tmp_path / 'sb'}"
    res = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    if "unshare failed" in res.stderr or "Operation not permitted" in res.stderr:
        pytest.skip(f"no user namespace for the test here: {res.stderr.strip()}")
    (with_userns, without) = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("[")]
    assert with_userns[1] == "error" and "Creating new namespace failed" in with_userns[2]
    assert "if user namespaces are disabled here, try sandbox.local.unshare_user: false" in with_userns[2]
    assert without == [False, "ok", "hello\n/bin/busybox\n"], res.stderr[-2000:]
