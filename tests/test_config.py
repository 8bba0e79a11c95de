import pytest

from farm.config import load_config
from farm.errors import ConfigError


def test_defaults_and_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("run_id: r1\nrollout:\n  n_samples: 2\n")
    cfg = load_config(cfg_file, ["rollout.concurrency=7", "output.format=parquet"])
    assert (cfg.run_id, cfg.rollout.n_samples, cfg.rollout.concurrency) == ("r1", 2, 7)
    assert cfg.output.format == "parquet"


@pytest.mark.parametrize(
    "overrides, needle",
    [(["rollout.n_samples=0"], "n_samples"), (["rollout.bogus=1"], "bogus"), (["nokey"], "key=value")],
)
def test_bad_config_is_a_clear_error(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, overrides)


def test_tokenizer_fixture_round_trips(hf_tokenizer):
    text = "héllo <tool_call> wörld"
    assert hf_tokenizer.decode(hf_tokenizer.encode(text)) == text


def test_endpoint_catalog(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "endpoints:\n"
        "  qwen: {kind: openai, base_url: 'http://h:8000/v1/', model: Qwen/Qwen3-8B, api_key_env: QWEN_KEY,\n"
        "         thinking: false, top_logprobs: 5, headers: {X-Team: rl}}\n"
        "  claude: {kind: anthropic, model: claude-sonnet-4-5, thinking_budget: 2048}\n"
    )
    cfg = load_config(cfg_file)
    assert cfg.endpoint == "farm" and not cfg.black_box and cfg.active_endpoint.kind == "farm"
    qwen = load_config(cfg_file, ["endpoint=qwen"]).active_endpoint
    assert (qwen.kind, qwen.api, qwen.base_url, qwen.thinking, qwen.headers) == (
        "openai", "chat", "http://h:8000/v1", False, {"X-Team": "rl"})
    claude = load_config(cfg_file, ["endpoint=claude"])
    assert claude.black_box and claude.active_endpoint.api_key_env == "ANTHROPIC_API_KEY"
    with pytest.raises(ConfigError, match="'nope' is not in the endpoints catalog"):
        load_config(cfg_file, ["endpoint=nope"])
    with pytest.raises(ConfigError, match="base_url"):
        load_config(None, ["endpoints.x.kind=openai", "endpoints.x.model=m", "endpoints.x.base_url=ftp://h"])
    with pytest.raises(ConfigError, match="api_key"):  # a key in the config itself is refused (extra=forbid)
        load_config(None, ["endpoints.x.kind=anthropic", "endpoints.x.model=m", "endpoints.x.api_key=sk-1"])
    with pytest.raises(ConfigError, match="kind"):
        load_config(None, ["endpoints.x.kind=gemini", "endpoints.x.model=m"])


def test_endpoint_api_key_comes_from_the_named_variable():
    from farm.config import endpoint_api_key

    hosted = ["endpoints.h.kind=openai", "endpoints.h.model=m", "endpoints.h.base_url=http://h/v1",
              "endpoints.h.api_key_env=H_KEY"]
    assert endpoint_api_key(load_config(None, hosted), {"H_KEY": "sk-1"}) is None  # endpoint: farm (default)
    cfg = load_config(None, [*hosted, "endpoint=h"])
    assert endpoint_api_key(cfg, {"H_KEY": "sk-1"}) == "sk-1"
    with pytest.raises(ConfigError, match=r"\$H_KEY, which is not set"):
        endpoint_api_key(cfg, {})
    assert "sk-1" not in cfg.model_dump_json()


def test_run_secrets_come_from_the_environment_once_and_never_show():
    import pickle

    from farm.secrets import RunSecrets

    hosted = ["endpoints.h.kind=openai", "endpoints.h.model=m", "endpoints.h.base_url=http://h/v1",
              "endpoints.h.api_key_env=H_KEY", "endpoint=h"]
    secrets = RunSecrets.from_environ(load_config(None, hosted), {"H_KEY": "sk-1", "E2B_API_KEY": "e2b-2"})
    assert (secrets.endpoint_api_key, secrets.e2b_api_key) == ("sk-1", "e2b-2")
    assert pickle.loads(pickle.dumps(secrets)) == secrets  # travels to the sandbox actors as one value
    shown = f"{secrets!r} {secrets}"
    assert "sk-1" not in shown and "e2b-2" not in shown and "endpoint_api_key=set" in shown
    assert RunSecrets.from_environ(load_config(None), {}) == RunSecrets()  # local sandboxes, farm engine: none
    with pytest.raises(ConfigError, match=r"\$H_KEY, which is not set"):
        RunSecrets.from_environ(load_config(None, hosted), {})
    with pytest.raises(ConfigError, match="sandbox.backend is e2b but E2B_API_KEY is not set"):
        RunSecrets.from_environ(load_config(None, ["sandbox.backend=e2b"]), {})


def test_shipped_hosted_config_is_valid():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "hosted.yaml", ["endpoint=claude"])
    assert cfg.black_box and cfg.active_endpoint.kind == "anthropic"


def test_the_endpoint_fixes_the_rollout_mode_and_the_mode_says_what_to_do():
    """FarmConfig.mode: token_exact for the farm engine, black_box for every hosted kind; what
    each mode starts, writes and watches for; its values are the rollouts table's strings."""
    from farm.config import RolloutMode

    hosted = {"openai": ["endpoints.h.kind=openai", "endpoints.h.model=m", "endpoints.h.base_url=http://h/v1"],
              "anthropic": ["endpoints.h.kind=anthropic", "endpoints.h.model=m"]}
    farm = load_config(None, hosted["openai"])  # a catalog entry alone changes nothing: endpoint farm
    assert farm.mode is RolloutMode.TOKEN_EXACT and not farm.black_box
    assert farm.mode.needs_engine and farm.mode.writes_samples and not farm.mode.endpoint_fails_sessions
    for kind, sets in hosted.items():
        cfg = load_config(None, [*sets, "endpoint=h"])
        assert cfg.mode is RolloutMode.BLACK_BOX and cfg.black_box, kind
        assert not cfg.mode.needs_engine and not cfg.mode.writes_samples and cfg.mode.endpoint_fails_sessions
    # the on-disk strings (the rollouts table's mode column) are the modes themselves
    assert [m.value for m in RolloutMode] == ["token_exact", "black_box"]
    assert RolloutMode("black_box") is RolloutMode.BLACK_BOX and f"{RolloutMode.TOKEN_EXACT}" == "token_exact"


@pytest.mark.parametrize("overrides, needle", [
    (["gateway.public_url=https://tunnel.example.com", "ray.num_sandbox_actors=2"],
     "is one fixed URL, but the run starts several sandbox actors (ray.num_sandbox_actors: 2)"),
    (["gateway.public_url=https://tunnel.example.com", "placement.sandbox_actors_per_node=2"],
     "(placement.sandbox_actors_per_node: 2)"),
    (["gateway.public_url=https://gw-{hostname}.example.com", "placement.sandbox_actors_per_node=2"],
     "names no {port}, but placement.sandbox_actors_per_node: 2 puts several sandbox actors on one node"),
])  # fmt: skip
def test_a_gateway_url_several_actors_would_share_is_refused(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert needle in str(err.value) and "'http://{node_ip}:{port}'" in str(err.value), str(err.value)


def test_a_gateway_url_per_actor_is_accepted():
    for overrides in (["gateway.public_url=https://tunnel.example.com"],  # one sandbox actor (one machine)
                      ["gateway.public_url=http://{node_ip}:{port}", "ray.num_sandbox_actors=8"],
                      ["gateway.public_url=https://gw-{hostname}.example.com", "gateway.port=8700"]):
        assert load_config(None, overrides).gateway.public_url == overrides[0].split("=", 1)[1]
    assert load_config("configs/e2b.yaml").ray.num_sandbox_actors == 1
