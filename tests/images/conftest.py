"""A real registry (Debian's docker-registry) on 127.0.0.1 per module, images built here in
the OCI layout and pushed to it with skopeo (the real client)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from farm.envs.config import EnvsConfig
from farm.envs.provider import EnvProvider
from farm.images.config import ImagesConfig
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.tasks.config import TasksConfig
from farm.tasks.model import ImageSource, Task
from farm.tasks.runtime import TaskRuntime
from testkit.oci import OciLayout
from testkit.registry import LocalRegistry

if shutil.which("docker-registry") is None or shutil.which("skopeo") is None:
    pytest.skip("docker-registry and skopeo are not installed (scripts/setup.sh installs them)", allow_module_level=True)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture
def layout(tmp_path: Path) -> OciLayout:
    return OciLayout(tmp_path / "layout")


def image_task(name: str, tid: str = "t", **src) -> Task:
    return Task(id=tid, instruction="x", workspace=ImageSource(image=name, **src), workdir="/testbed",
                verify_commands=["true"])  # fmt: skip


@pytest.fixture
async def provider_for_images(tmp_path: Path):
    """``make(**ImagesConfig fields) -> EnvProvider`` on a fresh store (sandboxes made on demand)."""
    made: list[EnvProvider] = []
    sb = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb"), runtime_dir=str(tmp_path / "rt")))

    def make(envs: dict | None = None, auth: str | None = None, **images) -> EnvProvider:
        runtime = TaskRuntime.from_config(TasksConfig(path=str(tmp_path / "none.jsonl"), cache_dir=str(tmp_path / "tasks"),
                                                      images=ImagesConfig(**images)))  # fmt: skip

        async def new_sandbox(spec: SandboxSpec):
            return await create_sandbox(sb, spec)

        p = EnvProvider(EnvsConfig(cache_dir=str(tmp_path / "envs"), **(envs or {})), runtime, new_sandbox,
                        labels={"run_id": "imgtest"}, registry_auth=auth)  # fmt: skip
        runtime.envs = p
        made.append(p)
        return p

    yield make
    for p in made:
        await p.close()
