"""Old module paths keep working for one release (issue 29 moved them): each old name
imports, warns that it moved, and hands out the very objects of its new home."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {  # old module -> (new module, names a user of the old one relies on)
    "farm.rollout.runlock": ("farm.run.lock", ["RunLock", "RunLocked"]),
    "farm.rollout.signals": ("farm.run.signals", ["stop_signals", "cleanup_phase"]),
    "farm.rollout.progress": ("farm.run.progress", ["RunProgress"]),
    "farm.rollout.stream": ("farm.run.stream", ["StreamConfig", "TaskStream", "StreamFeed", "Curriculum"]),
    "farm.rollout.summary": ("farm.run.summary", ["RunSummary", "summarize", "write_summary", "directory_summary"]),
    "farm.rollout.tasks": ("farm.run.tasks", ["load_run_tasks"]),
    "farm.rollout.plan": ("farm.run.stream", ["expand_rollouts"]),
    "farm.model": ("farm.modeltext", []),
    "farm.model.tokenizer": ("farm.modeltext.tokenizer", ["resolve_tokenizer", "load_tokenizer"]),
    "farm.model.toolcalls": ("farm.modeltext.toolcalls", ["ToolCall", "ToolCallFormat", "get_format", "split_reasoning"]),
    "farm.engine.scripted": ("farm.simulator", ["ScriptedWorker", "WorkerSettings", "serve_worker", "ScriptedPolicy",
                                                "PolicyReply", "make_policy", "Scorer"]),
    "farm.engine.scripted.choose": ("farm.simulator.choose", ["ChoosePolicy", "LABELS", "CANDIDATES_KEY"]),
    "farm.engine.scripted.endless": ("farm.simulator.endless", ["LoopPolicy"]),
    "farm.engine.scripted.oracle": ("farm.simulator.oracle", ["OraclePolicy", "find_shell_tool"]),
    "farm.engine.scripted.policy": ("farm.simulator.policy", ["Choice", "Policy", "PolicyReply", "PolicyRequest",
                                                              "SamplingParams"]),
    "farm.engine.scripted.protocol": ("farm.simulator.protocol", ["SamplingParams"]),
    "farm.engine.scripted.scoring": ("farm.simulator.scoring", ["Scorer"]),
    "farm.testing.tokenizer": ("farm.modeltext.builtin_tokenizer", ["build_tokenizer"]),
    "farm.trajectory.reader": ("farm.output.shard_reader", ["ShardReader", "committed_files"]),
    "farm.trajectory.output": ("farm.output.reader", ["open_sample_reader", "open_sample_writer"]),
    "farm.trajectory.torch_data": ("farm.output.torch_data", ["make_torch_dataset", "worker_shard", "shard_of"]),
    "farm.trajectory.config": ("farm.output.config", ["OutputConfig"]),
    "farm.rollout.store": ("farm.output.writer", ["RolloutStore", "ROLLOUTS_TABLE", "SAMPLES_TABLE", "TRANSCRIPTS_TABLE"]),
    "farm.rollout.table": ("farm.output.rows", ["ROLLOUT_SCHEMA", "migrate_rollouts"]),
    "farm.rollout.artifacts": ("farm.output.artifacts", ["build_artifacts", "read_index", "read_text", "artifact_dir"]),
    "farm.rollout.group_reader": ("farm.output.groups", ["GroupReader", "Group", "GroupOrder"]),
    "farm.rollout.groups": ("farm.output.groups", ["complete_groups", "group_states", "GroupState"]),
    "farm.rollout.parts": ("farm.rollout.actor_layers", ["ActorLayers", "FarmParts", "make_actor_limiter"]),
    "farm.rollout.outdir": ("farm.output.outdir", ["check_tasks_source", "write_run_config", "RUN_CONFIG"]),
    "farm.single.placement": ("farm.single.runtime", ["InProcess", "OnRay"]),
    "farm.driver": ("farm.run.batch", ["run_batch"]),
    "farm.continuous": ("farm.run.continuous", ["Farm", "FarmStopped"]),
}
# names farm.trajectory itself handed out -> their module now
MOVED_NAMES = {
    "ShardReader": "farm.output.shard_reader",
    "ShardWriter": "farm.output.shards",
    "ManifestEntry": "farm.output.manifest",
    "RecoveryReport": "farm.output.shards",
    "committed_files": "farm.output.shard_reader",
    "open_sample_reader": "farm.output.reader",
    "open_sample_writer": "farm.output.reader",
}

# names a module that still stands handed out -> (that module, their module now)
MOVED_OUT = {
    "actor_name": ("farm.actors.assembly", "farm.actors.ray_cluster"),
    "init_ray": ("farm.actors.assembly", "farm.actors.ray_cluster"),
    "leave_ray": ("farm.actors.assembly", "farm.actors.ray_cluster"),
    "RolloutSummary": ("farm.rollout.model", "farm.output.rows"),
    "RolloutCounts": ("farm.rollout.model", "farm.output.rows"),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_still_imports_and_says_where_it_went(old):
    new, names = MOVED[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"moved to {new}"):
        shim = importlib.import_module(old)
    home = importlib.import_module(new)
    assert all(getattr(shim, name) is getattr(home, name) for name in names)


@pytest.mark.parametrize("name", sorted(MOVED_NAMES))
def test_a_name_farm_trajectory_handed_out_still_resolves(name):
    import farm.trajectory

    with pytest.warns(DeprecationWarning, match=f"farm.trajectory.{name} moved to {MOVED_NAMES[name]}"):
        obj = getattr(farm.trajectory, name)
    assert obj is getattr(importlib.import_module(MOVED_NAMES[name]), name)
    with pytest.raises(AttributeError):
        farm.trajectory.NoSuchName  # noqa: B018


@pytest.mark.parametrize("name", sorted(MOVED_OUT))
def test_a_name_that_left_a_standing_module_still_resolves_there(name):
    old, new = MOVED_OUT[name]
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}"):
        obj = getattr(importlib.import_module(old), name)
    assert obj is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        importlib.import_module(old).NoSuchName  # noqa: B018


@pytest.mark.parametrize("name", ["TRANSCRIPT_SCHEMA", "transcript_table"])
def test_the_transcripts_table_names_still_resolve_from_farm_trajectory_transcript(name):
    import farm.output.rows
    import farm.trajectory.transcript

    with pytest.warns(DeprecationWarning, match=f"transcript.{name} moved to farm.output.rows"):
        assert getattr(farm.trajectory.transcript, name) is getattr(farm.output.rows, name)


def test_the_old_entry_points_are_the_new_ones():
    sys.modules.pop("farm.driver", None)
    with pytest.warns(DeprecationWarning, match="farm.run.batch"):
        from farm.driver import run_farm
    from farm.run.batch import run_batch

    assert run_farm is run_batch

    import farm
    from farm.run.continuous import Farm, FarmStopped

    assert (farm.Farm, farm.FarmStopped) == (Farm, FarmStopped)  # the face's lazy names: the new home
