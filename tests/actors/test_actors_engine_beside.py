"""The engine starts beside the sandbox actors (``FarmActors.start_engine(wait=False)``, as
``farm run`` and ``farm.Farm`` start them): the actors' processes come up while the engine
is not, and get its URL from the router when they get ready, again after a restart; an
engine that fails to start is reported as its own failure. Real Ray (the session's shared
one), the real RouterActor in its ``external`` mode against a health endpoint of ours."""

from __future__ import annotations

import http.server
import sys
import threading
import time
from pathlib import Path

import pytest
import ray

import farm_helpers
from farm.actors.assembly import FarmActors
from farm.config import FarmConfig
from farm.engine.processes import free_port

pytestmark = pytest.mark.slow


class UrlParts(farm_helpers.FakeParts):
    """FakeParts that keep the engine URL they were built with."""

    def __init__(self, cfg, engine_url, **kw):
        super().__init__(cfg, engine_url, **kw)
        self.engine_url = engine_url


@pytest.fixture(scope="module", autouse=True)
def ray_local(shared_ray):
    ray.cloudpickle.register_pickle_by_value(farm_helpers)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # UrlParts, in the actors


class _Health(http.server.BaseHTTPRequestHandler):
    release = threading.Event()  # GET /health answers once set: the engine is "up" then

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.release.wait(60)
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _cfg(tmp_path: Path, run_id: str, url: str, health_timeout_s: float) -> FarmConfig:
    return FarmConfig.model_validate({
        "run_id": run_id,
        "engine": {"mode": "external", "url": url, "health_timeout_s": health_timeout_s},
        "sandbox": {"local": {"base_dir": str(tmp_path / "sandboxes")}},
        "ray": {"num_sandbox_actors": 2, "actor_max_restarts": 1},
        "output": {"dir": str(tmp_path / "out")},
    })


def _engine_url_of(actor) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: self._parts.engine_url), timeout=60)


def test_sandbox_actors_start_while_the_engine_does_and_ask_the_router_for_its_url(tmp_path):
    _Health.release.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    actors = FarmActors(_cfg(tmp_path, "beside", url, 90), parts_factory=UrlParts)
    try:
        assert actors.start_engine([], wait=False) == ""  # returns while the engine is not up
        started = threading.Thread(target=actors.start_sandbox_actors)
        started.start()
        # both actors' processes are up and answering while the engine still is not
        # (with the engine started first, this waits for ever: it is not up until released)
        for name in ["farm-beside-sandbox-0", "farm-beside-sandbox-1"]:
            deadline = 60.0
            while name not in actors.actors:
                started.join(0.1)
                deadline -= 0.1
                assert deadline > 0, f"{name} not started"
            ray.get(actors.actors[name].__ray_call__.remote(lambda self: self.name), timeout=60)
        assert started.is_alive() and not _Health.release.is_set()
        _Health.release.set()
        started.join(120)
        assert not started.is_alive()
        assert actors.engine_url == url
        for actor in actors.actors.values():
            assert _engine_url_of(actor) == url
        # a restarted actor runs its constructor again with the same arguments: it asks again
        victim = actors.actors["farm-beside-sandbox-0"]
        pid = ray.get(victim.__ray_call__.remote(lambda self: __import__("os").getpid()))
        ray.kill(victim, no_restart=False)
        deadline = time.monotonic() + 60
        while True:
            try:
                if ray.get(victim.__ray_call__.remote(lambda self: __import__("os").getpid()), timeout=30) != pid:
                    break
            except ray.exceptions.RayActorError:
                time.sleep(0.5)  # poll: the loop's deadline bounds the wait
            assert time.monotonic() < deadline, "not restarted"
        ray.get(victim.ready.remote(), timeout=60)
        assert _engine_url_of(victim) == url
    finally:
        _Health.release.set()
        actors.close()
        server.shutdown()


def test_an_engine_that_fails_to_start_beside_them_is_reported_as_itself(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    actors = FarmActors(_cfg(tmp_path, "nostart", url, 2), parts_factory=UrlParts)
    try:
        actors.start_engine([], wait=False)
        with pytest.raises(Exception, match="is not healthy"):
            actors.start_sandbox_actors()
    finally:
        actors.close()
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in names if n.startswith("farm-nostart-")], names
