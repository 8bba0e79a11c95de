"""The configuration reference is generated from the models and cannot drift: every key
has a description, the committed docs/reference files equal what the generator makes
now, the JSON Schema validates the shipped configs, `farm config show` never prints a
credential."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from farm import config_reference as ref
from farm.cli import main
from farm.config import FarmConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# one of each union variant, so the walk's coverage is checked on every kind
VARIANTS = [
    "loggers=[{kind: wandb, tags: [a]}, {kind: mlflow}]",
    "endpoints.f={kind: farm}",
    "endpoints.o={kind: openai, base_url: 'http://h/v1', model: m}",
    "endpoints.a={kind: anthropic, model: c}",
    "engine.moe={layers: 2, top_k: 2, experts: 8}",
    "gateway.engine_client.routed_experts={layers: 2, top_k: 2, experts: 8}",
]


def test_every_key_has_a_description():
    missing = [k.path for k in ref.config_keys() if not k.description.strip()]
    assert missing == [], f"config keys without a description (add Field(description=...)): {missing}"


def test_the_committed_reference_is_what_the_models_say():
    want = ref.render_markdown()
    have = (ROOT / ref.REFERENCE_PATH).read_text()
    assert have == want, f"{ref.REFERENCE_PATH} is stale: run `{ref.GENERATE}`"
    assert (ROOT / ref.SCHEMA_PATH).read_text() == ref.schema_text(), f"{ref.SCHEMA_PATH} is stale: run `{ref.GENERATE}`"


def _leaf_paths(node, prefix: str, values: set[str], parent_key: str = "") -> set[str]:
    """Dotted paths of a dumped config, list items as ``[]`` and endpoint names as ``<name>``;
    a mapping of plain values (``harness.versions``) is one key."""
    mapping_of_values = prefix in values and not any(isinstance(v, dict) for v in node.values())
    if isinstance(node, dict) and node and not mapping_of_values:
        out: set[str] = {prefix} if prefix else set()
        for k, v in node.items():
            part = "<name>" if parent_key == "endpoints" else k
            out |= _leaf_paths(v, f"{prefix}.{part}" if prefix else part, values, k)
        return out
    if isinstance(node, list) and node and isinstance(node[0], dict):
        return {prefix} | set().union(*(_leaf_paths(v, prefix + "[]", values) for v in node))
    return {prefix}


@pytest.mark.parametrize("config", [None, *CONFIGS], ids=lambda p: getattr(p, "name", "defaults"))
def test_the_walk_covers_every_key(config):
    cfg = load_config(config, VARIANTS)
    values = {k.path for k in ref.config_keys() if k.type.startswith("dict[")}
    dumped = _leaf_paths(cfg.model_dump(mode="json"), "", values)
    keys = {k.path for k in ref.config_keys()} | {s.path for s in ref.config_sections()}
    assert dumped - keys == set()


def test_types_defaults_and_constraints_are_read_from_the_models():
    keys = {k.path: k for k in ref.config_keys()}
    assert keys["rollout.n_samples"].constraints == ">= 1" and keys["rollout.n_samples"].default == "1"
    assert keys["gateway.sampling.top_p"].constraints == "> 0, <= 1"
    assert keys["output.format"].type == '"arrow" | "parquet"'
    assert keys["rollout.agent_timeout_s"].type == "float | null" and keys["rollout.agent_timeout_s"].default == "null"
    assert keys["endpoints.<name>.model"].constraints == "length >= 1" and keys["endpoints.<name>.model"].default == "required"
    assert keys["sandbox.local.limits.memory_bytes"].default == "8589934592 (8 GiB)"
    assert keys["sandbox.local"].section == "sandbox.local" and keys["loggers"].section == "loggers[]"
    variants = [s.variant for s in ref.config_sections() if s.path == "endpoints.<name>"]
    assert variants == ["kind: farm", "kind: openai", "kind: anthropic"]
    md = ref.render_markdown()
    assert '<a id="sandbox-local-limits"></a>' in md and "](#sandbox-local-limits)" in md
    assert "| `gateway.sampling.top_p` | float | 1.0 | > 0, <= 1 | nucleus sampling |" in md


def test_the_schema_validates_configs_as_editors_do():
    schema = ref.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in CONFIGS:
        first = path.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../docs/reference/config.schema.json", path
        assert (path.parent / "../docs/reference/config.schema.json").resolve().is_file()
        assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == [], path
    bad = list(validator.iter_errors({"rollout": {"n_sample": 2, "concurrency": 0}, "sandbox": {"backend": "docker"}}))
    assert len(bad) == 3  # the misspelled key, the bound, the choice: all found, as pydantic finds them
    n_samples = schema["$defs"]["RolloutConfig"]["properties"]["n_samples"]
    assert n_samples["description"] and n_samples["minimum"] == 1 and n_samples["default"] == 1


def test_config_show_prints_the_effective_config_and_never_a_secret(tmp_path, capsys, monkeypatch):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("run_id: mine\nrollout: {n_samples: 4}\nharness: {extra_env: {GITHUB_TOKEN: ghp-sekrit, "
                        "LANG: C}}\nengine: {launch: {extra_args: [--api-key, sk-launch, --token=tok-9, --tp, '2']}}\n")  # fmt: skip
    monkeypatch.setenv("MY_KEY", "sk-never-shown")
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    assert main(["config", "show", "--config", str(cfg_file), "--set", "rollout.concurrency=9",
                 "--set", "sandbox.backend=e2b", "--set",
                 "endpoints={o: {kind: openai, base_url: 'http://h/v1', model: m, api_key_env: MY_KEY,"
                 " headers: {Authorization: Bearer sk-header, X-Team: rl}}}"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    assert (shown["run_id"], shown["rollout"]["n_samples"], shown["rollout"]["concurrency"]) == ("mine", 4, 9)
    assert shown["output"]["dir"] == "runs/local" and shown["tasks"]["path"] == "demo"  # defaults filled in
    assert shown["endpoints"]["o"]["headers"] == {"Authorization": ref.MASKED, "X-Team": "rl"}
    assert shown["harness"]["extra_env"] == {"GITHUB_TOKEN": ref.MASKED, "LANG": "C"}
    assert shown["engine"]["launch"]["extra_args"] == ["--api-key", ref.MASKED, f"--token={ref.MASKED}", "--tp", "2"]
    for secret in ("sk-never-shown", "sk-header", "ghp-sekrit", "sk-launch", "tok-9"):
        assert secret not in out
    assert "#   MY_KEY: set\n" in out and "#   E2B_API_KEY: NOT SET\n" in out
    assert main(["config", "show", "--set", "rollout.n_samples=0"]) == 2
    assert "n_samples" in capsys.readouterr().err


def test_config_schema_and_reference_commands(tmp_path, capsys):
    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "farm run config"
    assert main(["config", "reference", "-o", str(tmp_path / "c.md"), "--schema", str(tmp_path / "s.json")]) == 0
    assert (tmp_path / "c.md").read_text() == ref.render_markdown()
    assert json.loads((tmp_path / "s.json").read_text()) == ref.json_schema()
    assert FarmConfig.model_validate(yaml.safe_load((ROOT / "configs/local.yaml").read_text())).run_id == "local"
