"""Files farm copies into a grading sandbox and runs there, in the task's environment.

They are data to farm: never imported by it (``farm.grading.witness`` and
``farm.grading.probe`` read their text). Each keeps to the standard library (the probe
also to pytest) and to Python 3.6:

- ``farm_witness.py``: the parent of the test command (SWE) or of each verify command
  (generic tasks), started before any of the workspace's code. It holds the key, takes
  what farm's code in the run reports over a socket, and writes the signed report.
- ``farm_probe.py``: the pytest plugin (``-p farm_probe``): what ran, how it ended.
- ``farm_probe_channel.py``: the probe's line to the witness, and the tripwires (audit
  hooks) that report any reach into it.
- ``farm_probe_fixed.py``: what a test is, fixed from the reset test files before any
  repository code runs; the comparisons in those tests, checked as they run.
- ``farm_verify.py``: the verifier's helper (generic tasks): the reward channel, and the
  workspace's code run out of process with a time limit.
"""
