"""E2B environment templates: the real e2b SDK (``AsyncTemplate.build``) against a
protocol-faithful fake of E2B's template-build API (the same routes, status codes and
JSON fields the SDK's generated client speaks: request a build, file-upload links, the
upload, start the build, poll its status with log offsets). No E2B key is needed."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import tarfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
from aiohttp import web
from e2b.exceptions import AuthenticationException

from farm.envs.config import EnvsConfig
from farm.envs.provider import EnvBuildFailed, EnvProvider, provider_for
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import E2BSandboxConfig, SandboxConfig
from farm.sandboxes.e2b import E2BSandbox
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks
from farm.tasks.runtime import TaskRuntime

KEY = "e2b_test_key"


class FakeTemplateApi:
    """E2B's template-build endpoints, as the SDK calls them."""

    def __init__(self) -> None:
        self.requests: list[dict] = []  # POST /v3/templates bodies
        self.starts: dict[str, dict] = {}  # build id -> POST .../builds/{id} body (the steps)
        self.uploads: dict[str, bytes] = {}  # files hash -> uploaded bytes
        self.polls = 0
        self.base = ""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_post("/v3/templates", self.request_build)
        app.router.add_get("/templates/{tid}/files/{hash}", self.upload_link)
        app.router.add_put("/upload/{hash}", self.upload)
        app.router.add_post("/v2/templates/{tid}/builds/{bid}", self.start)
        app.router.add_get("/templates/{tid}/builds/{bid}/status", self.status)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler):  # noqa: ANN001, ANN201
        if request.path.startswith("/upload/"):
            return await handler(request)  # a presigned URL: no API key
        if request.headers.get("X-API-KEY") != KEY:
            return web.json_response({"code": 401, "message": "Invalid API key"}, status=401)
        return await handler(request)

    async def request_build(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        n = len(self.requests)
        return web.json_response({"templateID": f"tpl{n}", "buildID": f"bld{n}", "public": False,
                                  "names": [body["name"]], "tags": ["default"], "aliases": [body["name"]]},
                                 status=202)  # fmt: skip

    async def upload_link(self, request: web.Request) -> web.Response:
        h = request.match_info["hash"]
        return web.json_response({"present": h in self.uploads, "url": f"{self.base}/upload/{h}"}, status=201)

    async def upload(self, request: web.Request) -> web.Response:
        self.uploads[request.match_info["hash"]] = await request.read()
        return web.Response(status=200)

    async def start(self, request: web.Request) -> web.Response:
        self.starts[request.match_info["bid"]] = await request.json()
        return web.Response(status=202)

    async def status(self, request: web.Request) -> web.Response:
        self.polls += 1
        bid, tid = request.match_info["bid"], request.match_info["tid"]
        steps = self.starts[bid].get("steps", [])
        offset = int(request.query.get("logsOffset", "0"))
        failing = next((i for i, s in enumerate(steps) if s["type"] == "RUN" and "exit 7" in s["args"][0]), None)
        lines = [f"step {i}: {s['type']} {' '.join(s.get('args', []))[:80]}" for i, s in enumerate(steps)]
        if failing is not None:
            lines = lines[: failing + 1] + ["boom-7: the setup step exited 7"]
        now = datetime.now(timezone.utc).isoformat()
        entries = [{"timestamp": now, "level": "info", "message": m} for m in lines][offset:]
        body = {"buildID": bid, "templateID": tid, "logs": [e["message"] for e in entries], "logEntries": entries,
                "status": "error" if failing is not None else "ready"}  # fmt: skip
        if failing is not None:
            body["reason"] = {"message": f"step {failing} failed: exit status 7", "step": str(failing)}
        return web.json_response(body)


@pytest.fixture
async def fake_api(monkeypatch):
    api = FakeTemplateApi()
    runner = web.AppRunner(api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    api.base = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("E2B_API_URL", api.base)
    yield api
    await runner.cleanup()


@pytest.fixture(scope="module")
def swe_row(tmp_path_factory) -> dict[str, Path]:
    from testkit.sdist_task import make_task_set

    return make_task_set(tmp_path_factory.mktemp("swe-row"))


def setup(tmp_path: Path, row: dict[str, Path], api_key: str = KEY, extra_setup: list[str] | None = None):
    cfg = TasksConfig(path=str(row["tasks"]), recipes=str(row["recipes"]), mirror_dir=str(row["mirrors"]),
                      cache_dir=str(tmp_path / "tc"))  # fmt: skip
    runtime = TaskRuntime.from_config(cfg)
    task = load_tasks(cfg).tasks[0]
    if extra_setup:
        task = task.model_copy(update={"setup_commands": [*task.setup_commands, *extra_setup]})
    sandbox = SandboxConfig(backend="e2b", e2b=E2BSandboxConfig())
    provider = provider_for(EnvsConfig(cache_dir=str(tmp_path / "envs")), sandbox, runtime, None, e2b_api_key=api_key)
    assert isinstance(provider, EnvProvider) and provider.backend == "e2b"
    runtime.envs = provider
    return provider, task


async def test_one_template_per_environment_built_with_the_sdk(fake_api, tmp_path, swe_row):
    provider, task = setup(tmp_path, swe_row)
    views = await asyncio.gather(*[provider.view_for(task) for _ in range(3)])
    assert len(fake_api.requests) == 1 and len({v.template for v in views}) == 1  # once for the group
    view = views[0]
    assert view.template == fake_api.requests[0]["name"] and view.template.startswith("farm-env-")
    assert view.mount == "/workspace/repo"
    (start,) = fake_api.starts.values()
    assert start["fromImage"] == task.metadata["docker_image"]  # the row's image is the base
    runs = [s["args"][0] for s in start["steps"] if s["type"] == "RUN"]
    assert runs[0].startswith("mkdir -p /workspace/repo && tar -xf /tmp/farm-workspace.tar")
    assert runs[1:1 + len(task.setup_commands)] == task.setup_commands  # each setup command, in order
    # then what each sandbox would compile (farm.tasks.pycache): the venvs' before the baseline
    # commit, the repository's after it (never in it)
    warm, commit, compiled = runs[-3:]
    assert "compileall" in warm and "pyvenv.cfg" in warm and "refs/farm/baseline" in commit
    assert "compileall" in compiled and "info/exclude" in compiled
    assert [s["args"][0] for s in start["steps"] if s["type"] == "WORKDIR"] == ["/workspace/repo"]
    # the upload is the workspace tarball: the repository at its base commit
    (blob,) = fake_api.uploads.values()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as outer:
        inner = outer.extractfile(outer.getmember("farm-workspace.tar")).read()
    with tarfile.open(fileobj=io.BytesIO(inner)) as ws:
        assert "./test_inflection.py" in ws.getnames() or "test_inflection.py" in ws.getnames()
    # a later run finds the record: no second build
    again, _ = setup(tmp_path, swe_row)
    assert (await again.view_for(task)).template == view.template and len(fake_api.requests) == 1
    # and every E2B sandbox of the task is created from that template
    created = {}

    class Sdk:
        @staticmethod
        async def create(**kw):
            created.update(kw)
            return type("S", (), {"sandbox_id": "sbx-9"})()

    sb = await E2BSandbox.create(E2BSandboxConfig(), SandboxSpec(view=view, image="ignored"), api_key=KEY, sdk=Sdk)
    assert created["template"] == view.template and sb.view == view


async def test_a_failed_template_build_is_recorded_once(fake_api, tmp_path, swe_row):
    provider, task = setup(tmp_path, swe_row, extra_setup=["echo building; exit 7"])
    errors = await asyncio.gather(*[provider.view_for(task) for _ in range(3)], return_exceptions=True)
    assert all(isinstance(e, EnvBuildFailed) for e in errors), errors
    assert "exit status 7" in str(errors[0]) and "boom-7" in str(errors[0])  # E2B's reason and its log
    again, _ = setup(tmp_path, swe_row, extra_setup=["echo building; exit 7"])
    with pytest.raises(EnvBuildFailed):
        await again.view_for(task)
    assert len(fake_api.requests) == 1


async def test_an_api_failure_is_infrastructure_not_a_recorded_failure(fake_api, tmp_path, swe_row):
    provider, task = setup(tmp_path, swe_row, api_key="e2b_wrong")
    with pytest.raises(AuthenticationException):
        await provider.view_for(task)
    assert provider.store.entries() == [] and fake_api.requests == []
    ok, _ = setup(tmp_path, swe_row)  # the right key later: it builds
    assert (await ok.view_for(task)).template
    assert json.loads(json.dumps(fake_api.requests))[0]["name"].startswith("farm-env-")


async def test_layered_templates_an_instance_from_its_base(fake_api, tmp_path, swe_row):
    """A task with base setup: a base template (the repository at its setup commit, the
    base setup, the checkout's tracked files and .git removed), then the instance's
    template from it; a second instance of the repository-version reuses the base."""
    provider, task = setup(tmp_path, swe_row)
    task = task.model_copy(update={"base_setup_commands": ["uv venv -q .venv"], "setup_commands": ["echo inst"]})
    other = task.model_copy(update={"id": "other", "setup_commands": ["echo other"]})
    views = await asyncio.gather(provider.view_for(task), provider.view_for(other))
    base_name, *names = [r["name"] for r in fake_api.requests]
    assert len(names) == 2 and {v.template for v in views} == set(names) and base_name not in names
    base_start, *starts = fake_api.starts.values()
    assert base_start["fromImage"] == task.metadata["docker_image"]
    base_runs = [s["args"][0] for s in base_start["steps"] if s["type"] == "RUN"]
    assert base_runs[1] == "uv venv -q .venv" and "rm -rf .git" in base_runs[-1] and "git ls-files -z" in base_runs[-1]
    assert "pyvenv.cfg" in base_runs[-2]  # the venv's bytecode before the checkout goes; no repository compiled
    owns = []  # the two instance builds run at once: either may start first
    for start in starts:
        assert start.get("fromTemplate") == base_name and "fromImage" not in start  # built from the base
        runs = [s["args"][0] for s in start["steps"] if s["type"] == "RUN"]
        assert runs[0].startswith("mkdir -p /workspace/repo && tar -xf") and ".git/info/exclude" in runs[1]
        assert "uv venv -q .venv" not in runs and "refs/farm/baseline" in runs[-2] and "compileall" in runs[-1]
        owns += [r for r in runs if r in ("echo inst", "echo other")]
    assert sorted(owns) == ["echo inst", "echo other"]
    kinds = sorted(e.record.kind for e in provider.store.entries())
    assert kinds == ["base", "instance", "instance"]
    # a failing base: every instance fails with its reason, no instance template is requested
    bad = task.model_copy(update={"id": "bad", "base_setup_commands": ["echo building; exit 7"]})
    n = len(fake_api.requests)
    with pytest.raises(EnvBuildFailed, match="base environment .* exit status 7"):
        await provider.view_for(bad)
    assert len(fake_api.requests) == n + 1


async def test_a_swesmith_row_in_its_image_gets_its_bug_in_the_template(fake_api, tmp_path, swe_row):
    """A row run in its image (SWE-smith's: the repository at /testbed, the bug as a pre-patch):
    the template starts from the image and applies the bug there, as a local sandbox does."""
    from farm.tasks.model import ImageSource

    provider, task = setup(tmp_path, swe_row)
    task = task.model_copy(update={"workspace": ImageSource(image="swebench/swesmith.x86_64.pypi__inflection.0000"),
                                   "workdir": "/testbed", "pre_patch": task.gold_patch})  # fmt: skip
    view = await provider.view_for(task)
    (start,) = fake_api.starts.values()
    assert start["fromImage"] == "swebench/swesmith.x86_64.pypi__inflection.0000" and view.mount == "/testbed"
    runs = [s["args"][0] for s in start["steps"] if s["type"] == "RUN"]
    assert any("git apply --index --whitespace=nowarn /tmp/farm-pre.patch" in r for r in runs)
    copied = [s for s in start["steps"] if s["type"] == "COPY"]
    assert copied and copied[0]["args"][1] == "/tmp/farm-pre.patch"
