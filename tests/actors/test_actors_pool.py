"""ActorPool (farm.actors.pool): the dispatcher's actor health and picking, without Ray."""

from __future__ import annotations

from farm.actors.pool import ActorPool, Health, pick_actor


def test_pick_actor_least_loaded_with_backpressure():
    assert pick_actor({"x": 2, "y": 1, "z": 1}, 2) == "y"
    assert pick_actor({"x": 0}, 1) == "x"
    assert pick_actor({"x": 2, "y": 2}, 2) is None
    assert pick_actor({}, 4) is None


def test_pick_actor_prefers_the_node_with_the_environment_while_it_has_room():
    assert pick_actor({"x": 0, "y": 1}, 2, prefer="y") == "y"  # y holds the snapshot: not the least loaded
    assert pick_actor({"x": 0, "y": 2}, 2, prefer="y") == "x"  # full: overflow elsewhere
    assert pick_actor({"x": 0}, 2, prefer="gone") == "x"  # its actor died: anyone
    assert pick_actor({"x": 2}, 2, prefer="x") is None


def test_load_is_taken_and_freed():
    pool = ActorPool(["a", "b"], capacity=2, max_deaths=1)
    assert pool.free_slots == 4
    for _ in range(3):
        pool.took(pool.pick())
    assert pool.load == {"a": 2, "b": 1} and pool.free_slots == 1 and pool.pick() == "b"
    pool.took("b")
    assert pool.pick() is None  # backpressure
    pool.freed("a")
    assert pool.pick() == "a" and pool.pick(prefer="b") == "a"


def test_an_actor_that_lost_a_rollout_takes_nothing_until_its_probe_answers():
    pool = ActorPool(["a", "b"], capacity=1, max_deaths=3)
    assert pool.lost("a") is Health.PROBE
    assert pool.lost("a") is Health.PROBING  # its other rollouts, lost in the same death: counted once
    assert pool.deaths["a"] == 1
    assert pool.pick(prefer="a") == "b" and pool.free_slots == 1
    pool.took("b")
    assert pool.pick() is None  # not the dead one, though it is the least loaded
    pool.probe_answered("a")
    assert pool.pick() == "a" and pool.free_slots == 1


def test_an_actor_that_keeps_dying_is_retired_and_the_pool_can_empty():
    pool = ActorPool(["a"], capacity=2, max_deaths=2)  # ray.actor_max_restarts = 1
    assert pool.lost("a") is Health.PROBE
    assert pool.probe_failed("a") is Health.PROBE  # not back yet: asked again
    assert pool.probe_failed("a") is Health.RETIRED  # a third death: more than Ray restarts
    assert pool.empty and pool.alive == [] and pool.pick() is None and pool.free_slots == 0
    assert pool.lost("a") is None and pool.probe_failed("a") is None  # retired once, reported once
    pool.freed("a")  # a retired actor's last rollout coming back is harmless
    assert pool.load == {}


def test_an_actor_that_joins_enters_the_pool_unloaded():
    pool = ActorPool(["a"], capacity=2, max_deaths=0)
    assert pool.lost("a") is Health.RETIRED
    pool.joined("n1")
    assert pool.alive == ["n1"] and pool.pick() == "n1" and pool.free_slots == 2 and pool.deaths["n1"] == 0
