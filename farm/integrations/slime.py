"""slime: farm groups as slime's rollout function (``--rollout-function-path``).

slime's RolloutManager loads the function by path and calls it once per rollout step::

    generate_rollout(args, rollout_id, data_source, evaluation=False)

and takes a ``RolloutFnTrainOutput(samples, metrics)`` (or, in older versions, the bare
nested list; ``slime.rollout.base_types.call_rollout_fn`` wraps it). The samples are
nested per prompt group; slime flattens every level, then builds its train data from
each ``Sample``'s ``tokens`` / ``response_length`` / ``loss_mask`` /
``rollout_log_probs`` / ``reward`` / ``status`` / ``index`` / ``rollout_id``.

farm gives ``args.rollout_batch_size`` done groups per step, shaped as slime's
*compact* rollouts: ``[group][rollout][chain]``. Every chain of one rollout is its own
slime ``Sample`` with the same ``rollout_id`` (an int: ``rows.rollout_key``), which is
what slime's ``validate_rollout_id_annotated`` asks of a rollout split into several
training samples, so its loss reducer averages them as one rollout. ``group_index`` is
the group's place in the run's task stream; ``index`` is unique per chain.

Where the groups come from (set with slime's ``--custom-config-path`` YAML, whose keys
become attributes of ``args``; this module is the entry point that reads them):

- ``farm_output_dir``: a farm output directory, followed while the run writes it
  (``farm run`` or ``farm.Farm`` writing it); ``farm_order`` (``task`` by default, so a
  restarted slime skips exactly the groups its earlier steps took), ``farm_group_size``
  (default: the run's ``rollout.n_samples``);
- or ``farm_source_fn``: ``"package.module:function"``, called once with ``args`` in
  the RolloutManager's process, returning any group source (e.g. a ``farm.Farm``);
- ``farm_timeout_s``: how long one step waits for its groups (default: no limit); when
  it passes, the step trains on the groups it has, or fails if it has none;
- ``farm_cursor_dir``: with ``farm_output_dir``, a directory where each step saves the
  reader's position after it (``step-00000012.json``, a ``farm.output.cursor.GroupCursor``):
  a slime restarted at step r reopens the stream from step r - 1's position instead of
  reading every group from the start and dropping r * batch of them; without a usable
  one (none saved, or the output directory's manifest rewritten since) it does that.

Evaluation (``evaluation=True``: slime's ``--eval-function-path`` defaults to this
function) is slime's own: delegated to ``slime.rollout.sglang_rollout.generate_rollout``.

With several chains per rollout a step has more Samples than
``rollout_batch_size * n_samples_per_prompt``, and slime's default GRPO reward
normalization then treats the whole batch as one group; set
``--custom-reward-post-process-path farm.integrations.slime.reward_post_process``,
which normalizes within each farm group, counting each rollout once.
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

from farm.errors import CursorError, IntegrationError
from farm.integrations.rows import rollout_key, rollouts_of
from farm.integrations.source import GroupSource, ReaderSource, as_group_source
from farm.output.cursor import GroupCursor
from farm.output.groups import GROUPS_OF_ONE, Group, GroupsOfOneWarning
from farm.trajectory.schema import to_slime_dict
from farm.output.groups import GroupReader

log = logging.getLogger(__name__)

_FEED_ATTR = "_farm_slime_rollout"  # the step function built from args, kept on args between calls


def slime_sample_cls() -> type | None:
    """slime's ``Sample`` class if slime is installed, else None (dicts are produced)."""
    try:
        # optional: slime
        from slime.utils.types import Sample
    except ImportError:
        return None
    return Sample


def to_slime_sample(sample: Any, *, sample_cls: type | None = None, tokenizer: Any = None) -> Any:
    """One farm Sample as a slime Sample (``sample_cls``; None: a dict in
    ``Sample.to_dict()`` form). ``rollout_id`` is the farm rollout's int key."""
    d = to_slime_dict(sample, tokenizer)
    d["rollout_id"] = rollout_key(sample.rollout_id)
    if sample_cls is None:
        return d
    from_dict = getattr(sample_cls, "from_dict", None)  # slime's own: status -> enum, unknown keys -> attributes
    return from_dict(d) if from_dict is not None else sample_cls(**d)


def group_to_slime(group: Group, *, sample_cls: type | None = None, tokenizer: Any = None) -> list[list[Any]]:
    """``[rollout][chain]`` slime Samples of one group."""
    return [[to_slime_sample(s, sample_cls=sample_cls, tokenizer=tokenizer) for s in chains]
            for chains in rollouts_of(group)]  # fmt: skip


def group_metrics(groups: list[Group]) -> dict[str, float]:
    """Scalars slime logs with the step (``RolloutFnTrainOutput.metrics``)."""
    rollouts = sum(len(rollouts_of(g)) for g in groups)
    samples = sum(len(g.samples) for g in groups)
    rewards = [r for g in groups for r in g.rewards]
    lo = [g.policy_versions[0] for g in groups if g.policy_versions[0] is not None]
    out = {"farm/groups": float(len(groups)), "farm/rollouts": float(rollouts), "farm/samples": float(samples),
           "farm/chains_per_rollout": samples / rollouts if rollouts else 0.0,
           "farm/resolved": float(sum(g.resolved for g in groups))}  # fmt: skip
    if rewards:
        out["farm/reward_mean"] = sum(rewards) / len(rewards)
    if lo:
        out["farm/policy_version_min"] = float(min(lo))
    return out


class SlimeRollout:
    """A slime rollout function over a group source (callable with slime's signature)."""

    def __init__(
        self,
        source: Any,
        *,
        sample_cls: type | None | Literal["auto"] = "auto",
        tokenizer: Any = None,
        timeout: float | None = None,
        skip_on_resume: bool | None = None,
        cursor_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``sample_cls``: the class to build ("auto": slime's, or dicts without slime).
        ``skip_on_resume``: a first call with ``rollout_id`` r > 0 (slime restarted from a
        checkpoint) first takes and drops the r * batch groups the earlier steps used:
        right for a reader that reads the directory again from its start, exact in a
        fixed order (``order="task"``); default: only for a ``GroupReader`` (a live
        ``farm.Farm`` hands out new groups only). ``cursor_dir`` (a ``GroupReader``
        source only): each step saves the reader's position there, and a resume at step
        r starts from step r - 1's position instead of skipping."""
        self.source: GroupSource = as_group_source(source)
        self.sample_cls = slime_sample_cls() if sample_cls == "auto" else sample_cls
        self.tokenizer, self.timeout = tokenizer, timeout
        self.skip_on_resume = isinstance(self.source, ReaderSource) if skip_on_resume is None else skip_on_resume
        self.cursor_dir = Path(cursor_dir) if cursor_dir is not None and isinstance(self.source, ReaderSource) else None
        self.calls = 0
        self.groups_taken = 0

    def _take(self, k: int) -> list[Group]:
        groups: list[Group] = []
        while len(groups) < k:
            got = self.source.next_groups(k - len(groups), timeout=self.timeout)
            groups.extend(got)
            if not got or self.timeout is not None:
                break  # exhausted, or the step's wait is over
        self.groups_taken += len(groups)
        return groups

    def __call__(self, args: Any, rollout_id: int, data_source: Any = None, evaluation: bool = False) -> Any:
        if evaluation:
            # optional extra: slime
            from slime.rollout.sglang_rollout import generate_rollout as slime_generate

            return slime_generate(args, rollout_id, data_source, evaluation=True)
        k = int(args.rollout_batch_size)
        if self.calls == 0 and rollout_id > 0 and self.skip_on_resume and not self._seek(rollout_id - 1):
            skipped = self._take(rollout_id * k)
            log.info("farm slime rollout: resumed at step %d, skipped %d groups", rollout_id, len(skipped))
        self.calls += 1
        groups = self._take(k)
        if self.cursor_dir is not None and groups:
            self.cursor_dir.mkdir(parents=True, exist_ok=True)
            self.source.position().save(self._cursor_path(rollout_id))  # type: ignore[attr-defined]
        if not groups:
            raise IntegrationError(f"slime rollout {rollout_id}: the farm source gave no group "
                                   f"(exhausted, or none done within farm_timeout_s={self.timeout})")
        if len(groups) < k:
            log.warning("farm slime rollout %d: %d of %d groups before the timeout", rollout_id, len(groups), k)
        samples = [group_to_slime(g, sample_cls=self.sample_cls, tokenizer=self.tokenizer) for g in groups]
        return train_output(samples, group_metrics(groups))


    def _cursor_path(self, step: int) -> Path:
        return self.cursor_dir / f"step-{step:08d}.json"  # type: ignore[operator]

    def _seek(self, step: int) -> bool:
        """Continue from the position saved after ``step``; False: none usable (skip instead)."""
        if self.cursor_dir is None or not self._cursor_path(step).is_file():
            return False
        try:
            self.source.seek(GroupCursor.load(self._cursor_path(step)))  # type: ignore[attr-defined]
        except CursorError as exc:
            log.warning("farm slime rollout: %s; reading the groups from the start", exc)
            return False
        log.info("farm slime rollout: resumed after step %d from %s", step, self._cursor_path(step))
        return True


def train_output(samples: list, metrics: dict[str, float]) -> Any:
    """slime's ``RolloutFnTrainOutput`` when slime has it, else the legacy bare list."""
    try:
        # optional: slime
        from slime.rollout.base_types import RolloutFnTrainOutput
    except ImportError:
        return samples
    return RolloutFnTrainOutput(samples=samples, metrics=metrics)


def _load(path: str) -> Callable[..., Any]:
    module, _, name = path.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), name)


def rollout_from_args(args: Any) -> SlimeRollout:
    """The step function ``args`` describe (see the module docstring), built once."""
    built = getattr(args, _FEED_ATTR, None)
    if built is not None:
        return built
    timeout = getattr(args, "farm_timeout_s", None)
    if getattr(args, "farm_source_fn", None):
        source = _load(args.farm_source_fn)(args)
    elif getattr(args, "farm_output_dir", None):
        source = GroupReader(args.farm_output_dir, size=getattr(args, "farm_group_size", None),
                             order=getattr(args, "farm_order", "task"))  # fmt: skip
    else:
        raise IntegrationError("farm's slime rollout needs farm_output_dir or farm_source_fn in args "
                               "(slime's --custom-config-path YAML)")
    built = SlimeRollout(source, timeout=float(timeout) if timeout is not None else None,
                         cursor_dir=getattr(args, "farm_cursor_dir", None))  # fmt: skip
    setattr(args, _FEED_ATTR, built)
    return built


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function signature: ``--rollout-function-path
    farm.integrations.slime.generate_rollout``."""
    return rollout_from_args(args)(args, rollout_id, data_source, evaluation=evaluation)


def reward_post_process(args: Any, samples: list[Any]) -> tuple[list[float], list[float]]:
    """For ``--custom-reward-post-process-path``: (raw rewards, rewards) like slime's
    default, but GRPO-normalized within each farm group with every rollout counted once
    (slime's default reshapes by ``n_samples_per_prompt``, which several chains per
    rollout break). Samples without farm metadata are one group per ``group_index``."""
    raw = [float(_get(s, "reward") or 0.0) for s in samples]
    # the rollout's own reward (with output.reward_policy=split a chain carries a share)
    rollout_reward = [_rollout_reward(s, r) for s, r in zip(samples, raw)]
    estimator = getattr(args, "advantage_estimator", "grpo")
    if not (estimator in ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
            and getattr(args, "rewards_normalization", True)):  # fmt: skip
        return raw, raw
    std_normalize = estimator in ("grpo", "gspo", "cispo") and getattr(args, "grpo_std_normalization", True)
    groups: dict[Any, dict[Any, float]] = {}  # group -> rollout -> reward
    keys = []
    for s, r in zip(samples, rollout_reward):
        farm = (_get(s, "metadata") or {}).get("farm", {})
        g = farm.get("group_id", _get(s, "group_index"))
        rid = _get(s, "rollout_id")
        keys.append((g, rid))
        groups.setdefault(g, {}).setdefault(rid, float(r))
    if groups and all(len(per_rollout) == 1 for per_rollout in groups.values()):
        warnings.warn(GROUPS_OF_ONE, GroupsOfOneWarning, stacklevel=2)  # every normalized reward below is 0
    stats = {}
    for g, per_rollout in groups.items():
        values = np.asarray(list(per_rollout.values()), dtype=np.float64)
        std = values.std(ddof=1) if len(values) > 1 else 0.0  # torch.std, as slime's default
        stats[g] = (values.mean(), (std + 1e-6) if std_normalize else 1.0)
    return raw, [float((groups[g][rid] - stats[g][0]) / stats[g][1]) for g, rid in keys]


def _get(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def _rollout_reward(sample: Any, reward: float) -> float:
    r = (_get(sample, "metadata") or {}).get("rollout_reward")
    return reward if r is None else float(r)
