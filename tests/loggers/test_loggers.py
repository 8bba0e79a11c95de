"""Run loggers (farm.loggers) without Ray: the real MLflow client on a local file store; a
sink that fails is reported once and disabled, and the others go on. W&B (offline) and
MLflow through a whole `farm run` are in test_farm_ray.py."""

from __future__ import annotations

from farm.loggers import RunLoggers
from farm.loggers.config import MlflowLoggerConfig

from logger_helpers import mlflow_run


class Broken:
    kind = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def start(self, run_id, config):
        pass

    def log_metrics(self, metrics, step):
        self.calls += 1
        raise ConnectionError("tracking server down")

    def log_summary(self, summary, rows):
        raise AssertionError("a disabled sink is not called again")

    def close(self):
        pass


def test_a_failing_sink_is_reported_once_and_the_others_go_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 wants it for a file:// store
    uri = (tmp_path / "mlruns").as_uri()
    notes: list[str] = []
    configs = [MlflowLoggerConfig(tracking_uri=(tmp_path / "file").as_uri() + "/x", interval_s=0),  # not a dir
               MlflowLoggerConfig(tracking_uri=uri, interval_s=0)]  # fmt: skip
    (tmp_path / "file").write_text("a file where the store's directory should be")
    loggers = RunLoggers.from_config(configs, str(tmp_path), note=notes.append)
    broken = Broken()
    loggers.add(broken, name="broken")
    loggers.start("run-1", {"harness": {"name": "codex"}})
    for step in range(1, 4):
        loggers.log_metrics({"rollouts/done": step, "reward/mean": step / 4}, step=step)
    loggers.close({"run_id": "run-1", "finished": 3, "by_status": {"completed": 3}, "mean_reward": 0.5})
    assert broken.calls == 1  # disabled at its first failure
    assert len(notes) == 2 and "logger broken failed to log metrics (ConnectionError: tracking server down)" in notes[1]
    assert "cannot be set up" in notes[0] and set(loggers.failed) == {"broken", f"mlflow ({configs[0].tracking_uri})"}
    run = mlflow_run(uri)
    assert run["status"] == "FINISHED" and run["name"] == "run-1"
    assert run["history"]["reward/mean"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert run["history"]["summary.by_status.completed"] == [(3, 3.0)]
    assert ["by_status.completed", "3"] in run["artifacts"]["summary_table.json"]["data"]
    assert run["artifacts"]["run_config.json"] == {"harness": {"name": "codex"}}


def test_the_interval_holds_back_metrics_and_close_flushes_the_last(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    loggers = RunLoggers.from_config([MlflowLoggerConfig(tracking_uri=uri, interval_s=3600)], str(tmp_path))
    loggers.start("run-2", {})
    for step in range(1, 6):
        loggers.log_metrics({"rollouts/done": step}, step=step)
    loggers.close()
    assert mlflow_run(uri)["history"]["rollouts/done"] == [(1, 1.0), (5, 5.0)]
