"""What only tests use, kept out of the farm package (and its wheel): a protocol-faithful
hosted LLM API (hosted.py), the reward-hack tricks (hack_tricks.py), real SWE-bench rows
built from PyPI sdists (sdist_task.py, astroid_tasks.py), pytest under farm's grading probe
outside a sandbox (probe_run.py), waiting on a condition with a deadline instead of a sleep
(waits.py). tests/ is on the tests' path (pyproject's pythonpath); a benchmark that needs one
adds it to sys.path itself."""
