"""Environment snapshots: a task's workspace after setup, built once, cloned per sandbox.

``identity`` (what determines an environment, and its key), ``store`` (the on-disk
cache: records, locks, ls/rm/gc), ``build`` (building one in a sandbox), ``provider``
(what rollouts and grading call: the view a sandbox starts from, built on first use).
"""
