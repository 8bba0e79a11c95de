"""tests/single: the one-rollout-at-a-time service (farm.Rollouts, farm rollout, farm serve)."""
