"""A task's workspace inside a sandbox: preparing it (``prepare``: repository, pre-patch,
setup, the post-setup commit, or an environment snapshot's record), capturing the agent's
diff (``capture``), and running task and git commands (``shell``). Used by rollouts,
grading and environment builds; above ``farm.tasks`` (data) and ``farm.sandboxes``."""
