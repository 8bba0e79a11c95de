"""A sandbox whose root is an image's file system: the coding-agent CLIs run from the host on
their own loader and libraries (an image with no C library at all here: static busybox), the
commands in the image's environment, farm's jail as for every local sandbox."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from farm.harnesses import make_harness
from farm.harnesses.config import HarnessConfig
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.hostrt import RT_MOUNT
from farm.sandboxes.views import SnapshotView
from farm.testing.oci import Entry, push, tar_of_entries
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
        # what the CLI's tools run is the image's (nothing of farm's loader leaks into their environment)
        env = await sb.exec(["env"])
        assert "LD_LIBRARY_PATH" not in env.stdout and "/.farm" not in env.stdout
        # farm's jail, unchanged: no host file system, its own network after the latch, the cgroup's limits
        host = await sb.exec(["sh", "-c", f"ls {sys.prefix} {os.path.expanduser('~')}/.cache 2>&1; ls /"])
        assert "No such file" in host.stdout and "busybox" not in host.stdout.split("No such file")[-1]
        await sb.isolate_network()
        net = await sb.exec(["sh", "-c", "cat /proc/net/dev | wc -l; wget -q -T 2 -O- http://127.0.0.1:1/ 2>&1; echo rc=$?"])
        assert net.stdout.splitlines()[0].strip() == "3" and "rc=0" not in net.stdout  # loopback only
        assert "cgroup" in sb.limits_policy["enforced_by"] or "rlimits" in sb.limits_policy["enforced_by"]
    assert not list((tmp_path / "sb").glob("img/*"))
    assert shutil.disk_usage(tmp_path).free > 0
