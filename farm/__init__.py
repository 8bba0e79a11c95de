"""farm: a Ray-actor distributed rollout farm for agentic RL on SWE tasks."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # farm.Farm (continuous mode) pulls in Ray: imported on first use only
    if name in ("Farm", "FarmStopped"):
        # heavy: aiohttp, numpy, orjson
        from farm.run import continuous

        return getattr(continuous, name)
    if name in ("Rollouts", "RolloutHandle", "InlineTask"):  # one rollout at a time (farm.single)
        from farm import single

        return getattr(single, name)
    raise AttributeError(f"module 'farm' has no attribute {name!r}")
