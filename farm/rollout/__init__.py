"""farm.rollout: one rollout end to end (pipeline, records, status mapping, the retry
decision), the rollouts table and the output directory's store. No Ray here. (The run
around the rollouts, its lock, stream, progress and summary: farm.run.)"""
