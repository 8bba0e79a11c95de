"""``farm run CONFIG [--set key=value ...]``: run every rollout of a config on Ray.

Locally this starts a Ray instance; under ``ray job submit`` it joins the job's
cluster. Reruns with the same ``output.dir`` resume: rollouts already in the output
are skipped (one invocation per output dir: a second one fails fast, exit 1). Ctrl-C
or ``ray job stop`` (SIGTERM) interrupts in-flight rollouts (not recorded: the next
invocation runs them again; a second signal cuts the drain short), flushes the reducer,
prints the summary and exits 130. Environment read here (and only here):
``E2B_API_KEY`` for ``sandbox.backend: e2b``; the variable a hosted endpoint's
``api_key_env`` names, when ``endpoint:`` selects one (black-box run).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config (see configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")


def run(args: argparse.Namespace) -> int:
    # heavy: numpy, pyarrow, pydantic; the CLI's start-up: a command loads its code when it runs
    from farm.config import load_config
    from farm.errors import FarmError

    try:
        cfg = load_config(args.config, args.overrides)
    except FarmError as exc:
        print(f"farm run: {exc}", file=sys.stderr)
        return 2
    # heavy: numpy, pyarrow, pydantic
    from farm.secrets import RunSecrets

    try:  # the keys, once, here: never written anywhere
        secrets = RunSecrets.from_environ(cfg, os.environ)
    except FarmError as exc:
        print(f"farm run: {exc}", file=sys.stderr)
        return 2
    # heavy: aiohttp, numpy, orjson
    from farm.run.batch import run_batch

    # SIGTERM before the driver installs its stop handlers (after ray.init): a plain stop.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        summary = run_batch(cfg, secrets=secrets)
    except FarmError as exc:
        print(f"farm run: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("farm run: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 130 if summary.interrupted else 0
