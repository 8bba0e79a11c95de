"""farm serve's request bodies are pydantic models (CreateRequest, FinalizeRequest): a bad
body is refused with a 400 naming what is wrong, before anything starts."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from farm.single.http import make_app

TOKEN = "t0ken"


class _Refused:
    """Rollouts that no valid request reaches in these tests: every body here is refused first."""

    running = True

    async def start(self, task, *, harness=None):  # pragma: no cover - reached only if validation let one through
        raise AssertionError(f"started {task!r}")

    def get(self, rid):
        return _Handle()


class _Handle:
    async def finalize(self, *, keep_aborted=False):
        return {"stored": False, "keep_aborted": keep_aborted}


async def test_bad_bodies_are_refused_with_what_is_wrong():
    app = make_app(_Refused(), TOKEN)  # type: ignore[arg-type]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with TestClient(TestServer(app), headers=auth) as http:
        for body, needle in [
            ({}, "exactly one of 'task'"),
            ({"task": "t", "inline": {"instruction": "x"}}, "exactly one of 'task'"),
            ({"task": "t", "extra": 1}, "unknown field 'extra'"),
            ({"task": 3}, "task: Input should be a valid string"),
            ({"inline": "x"}, "inline: Input should be a valid dictionary"),
            ({"task": "t", "harness": ["a"]}, "harness: Input should be a valid string"),
        ]:
            r = await http.post("/rollouts", json=body)
            error = (await r.json())["error"]
            assert r.status == 400 and error["type"] == "invalid_request" and needle in error["message"], (body, error)
        for body, needle in [({"keep_aborted": "yes"}, "keep_aborted: Input should be a valid boolean"),
                             ({"keep": True}, "unknown field 'keep'")]:  # fmt: skip
            r = await http.post("/rollouts/x/finalize", json=body)
            error = (await r.json())["error"]
            assert r.status == 400 and needle in error["message"], (body, error)
        r = await http.post("/rollouts/x/finalize", json={"keep_aborted": True})
        assert r.status == 200 and (await r.json()) == {"stored": False, "keep_aborted": True}
        r = await http.post("/rollouts/x/finalize")  # no body: the defaults
        assert r.status == 200 and (await r.json())["keep_aborted"] is False
