"""farm.rollout: one rollout end to end (pipeline, records, status mapping, the retry
decision). No Ray here. (The run around the rollouts, its lock, stream, progress and
summary: farm.run; the output directory it is written to: farm.output.)"""

from farm.moved import install as _install_moved

_install_moved()  # farm.rollout.{store,table,artifacts,group_reader,groups,outdir} moved to farm.output; parts to actor_layers
