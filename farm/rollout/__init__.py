"""farm.rollout: one rollout end to end (pipeline, records, status mapping, the retry
decision). No Ray here. (The run around the rollouts, its lock, stream, progress and
summary: farm.run; the output directory it is written to: farm.output.)"""
