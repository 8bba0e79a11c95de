"""Shared fixtures. Tests never read ../shared: they build what they need."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

# Ray's start-up waits, for every Ray a test starts (in this process, or in the `farm run`,
# `ray start` and benchmark subprocesses, which inherit the environment): the driver waits for
# its raylet to register with the GCS (each lookup retries for raylet_start_wait_time_s), and
# the raylet waits for its agents (the dashboard agent's, the runtime-env agent's port files)
# first. Under load on 2 shared cores an agent's start (a Python process importing aiohttp,
# grpc, opentelemetry) took longer than Ray's defaults allow ("The current node timed out
# during startup"); a start that takes long is not what these tests check.
os.environ.setdefault("RAY_raylet_start_wait_time_s", "180")
os.environ.setdefault("RAY_agent_register_timeout_ms", "180000")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real byte-level BPE + Qwen3-style chat template, trained for the session."""
    from farm.modeltext.builtin_tokenizer import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="session")
def tok_path(tokenizer_dir: Path) -> str:
    return str(tokenizer_dir)


@pytest.fixture
async def make_worker(hf_tokenizer):
    """In-process simulated policy workers (farm.simulator):
    ``await make_worker(policy, scorer=None, **WorkerSettings fields) -> (worker, url)``, served in this loop."""
    from farm.simulator import ScriptedWorker, WorkerSettings, serve_worker

    stack = contextlib.AsyncExitStack()

    async def make(policy, scorer=None, **settings):
        worker = ScriptedWorker(hf_tokenizer, policy, WorkerSettings(**settings), scorer=scorer)
        url = await stack.enter_async_context(serve_worker(worker))
        return worker, url

    yield make
    await stack.aclose()


@pytest.fixture(scope="session")
def dataset_images(tmp_path_factory: pytest.TempPathFactory):
    """A real registry (docker-registry on 127.0.0.1) holding images in the layouts of SWE-bench,
    SWE-smith, SWE-Gym and SWE-rebench (testkit.dataset_images), for the session; yields
    (registry host, rows by kind). Built once: the base layers are cached per machine."""
    import shutil

    from testkit.dataset_images import publish_demo_images
    from testkit.registry import LocalRegistry

    if shutil.which("docker-registry") is None or shutil.which("skopeo") is None:
        pytest.skip("docker-registry and skopeo are not installed (scripts/setup.sh installs them)")
    root = tmp_path_factory.mktemp("dataset-images")
    with LocalRegistry(root / "registry") as registry:
        yield registry.host, publish_demo_images(registry.host, root / "layout", root / "demo")


@pytest.fixture
async def http():
    import aiohttp

    async with aiohttp.ClientSession() as session:
        yield session


# --- one local Ray for the modules that run the farm in this process -------------------------
# Starting Ray costs seconds of the two cores (its GCS, raylet and first workers), and six
# modules of the slow set start the same local Ray (2 CPUs, namespace "farm", no dashboard)
# for their in-process runs. They share one: `shared_ray` starts it on first use and leaves
# it running for the next module; the modules using it run one after another (collection
# order below), and before any other test it is shut down (a test starting or joining a Ray
# of its own, or a subprocess run, finds none of it). Each test still ends with none of its
# actors alive (the tests check it), so what one module did is not what the next one sees.
SHARED_RAY = "shared_ray"


class _SharedRay:
    running = False

    def start(self) -> None:
        import ray

        if not self.running:
            ray.init(num_cpus=2, include_dashboard=False, namespace="farm", log_to_driver=False)
            self.running = True

    def stop(self) -> None:
        import ray

        if self.running:
            ray.shutdown()
            self.running = False


_shared_ray = _SharedRay()


@pytest.fixture(scope="module")
def shared_ray():
    """The session's local Ray (2 CPUs, namespace "farm"), connected; see above."""
    _shared_ray.start()
    yield


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests using `shared_ray` run together, from where the first of them is (each
    module's tests keep their order): one Ray start for all of them. Under pytest-xdist
    (scripts/test.sh runs it), see `_group_for_workers`."""
    users = [item for item in items if SHARED_RAY in item.fixturenames]
    if users:
        at = items.index(users[0])
        others = [item for item in items if SHARED_RAY not in item.fixturenames]
        items[:] = others[:at] + users + others[at:]
    # Under xdist the workers collect, and in a worker `--dist` reads "no": xdist sets
    # `loadgroup` there instead (and reads the xdist_group marks after this hook).
    if getattr(config.option, "loadgroup", False):
        _group_for_workers(items)


# --- pytest-xdist: every Ray on one worker, what must stay together together, the long first --
# scripts/test.sh runs the suite on several workers with `--dist loadgroup`: a test without an
# xdist_group goes to whichever worker is free, the tests of one group all go to one worker,
# one after another in collection order. Grouped here:
# - every test that starts a Ray: the `shared_ray` users and the tests marked `starts_ray`
#   (a `farm run` or `ray job` subprocess, `ray start`, a multi-node Cluster(), a benchmark
#   starting its own) are one group, RAY_GROUP: Ray work runs one test at a time, as in a
#   serial run, while the other workers run the rest (sandboxes, tasks, envs, gateway, docs).
#   Two Rays starting at once on 2 cores timed out, and each end-to-end run's waits are sized
#   for one run at a time. The shared Ray's users come first in the group (one start), and it
#   is shut down before the group's next test (`pytest_runtest_setup`);
# - each other module with a module- or class-scoped fixture: split over workers it would run
#   once per worker (the folded end-to-end runs are such fixtures).
# Each worker has its own session fixtures (tokenizer, registry) and its own tmp_path root.
# The Ray group is sent first, then the slow tests: a long test that starts last would leave
# the other worker idle at the end.
RAY_GROUP = "ray"


def _starts_ray(item: pytest.Item) -> bool:
    return SHARED_RAY in item.fixturenames or item.get_closest_marker("starts_ray") is not None


def _group_for_workers(items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_ray(item):
            item.add_marker(pytest.mark.xdist_group(RAY_GROUP))
        elif item.get_closest_marker("xdist_group") is None and _shares_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))

    def rank(item: pytest.Item) -> int:
        if SHARED_RAY in item.fixturenames:
            return 0
        if _starts_ray(item):
            return 1
        return 2 if item.get_closest_marker("slow") is not None else 3

    items.sort(key=rank)  # stable: each module's tests keep their order


def _shares_fixtures(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "class") for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if SHARED_RAY not in item.fixturenames:
        _shared_ray.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _shared_ray.stop()
