"""farm.engine: the policy engine as farm drives it: its config, the SGLang ``/generate``
client, the router and server launchers and their processes, and routed-expert codecs.
The simulated worker it launches in ``simulator`` mode lives in ``farm.simulator``."""
