"""farm.run: one run on one output directory, beside the rollouts it runs: its lock,
its tasks, its task stream, its progress, its stop signals and its summary. No Ray here.
(Importing this package imports nothing: ``farm.config`` reads ``farm.run.config``.)"""
