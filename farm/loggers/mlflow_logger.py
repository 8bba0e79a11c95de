"""MLflow sink, through ``MlflowClient`` (no global active run): a run in the configured
experiment, metrics per step in batches, the summary's scalars as metrics and its table
as the ``summary_table.json`` artifact (plus ``summary.json`` and ``run_config.json``)."""

from __future__ import annotations

import time
from typing import Any

from farm.loggers.config import MlflowLoggerConfig
from farm.loggers.flatten import scalars


class MlflowLogger:
    kind = "mlflow"

    def __init__(self, cfg: MlflowLoggerConfig) -> None:
        from mlflow.tracking import MlflowClient  # the optional extra (mlflow-skinny is enough)

        self.cfg = cfg
        self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
        self.run_id: str | None = None
        self._step = 0

    def start(self, run_id: str, config: dict[str, Any]) -> None:
        exp = self.client.get_experiment_by_name(self.cfg.experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.cfg.experiment)
        run = self.client.create_run(exp_id, run_name=self.cfg.run_name or run_id, tags={"farm.run_id": run_id})
        self.run_id = run.info.run_id
        self.client.log_dict(self.run_id, config, "run_config.json")  # the whole config (too many keys for params)

    def _metrics(self, metrics: dict[str, float], step: int) -> None:
        # optional extra: mlflow
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])
        self._step = max(self._step, step)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._metrics(metrics, step)

    def log_summary(self, summary: dict[str, Any], rows: list[tuple[str, str]]) -> None:
        self._metrics({f"summary.{k}": v for k, v in scalars(summary).items()}, self._step)
        self.client.log_dict(self.run_id, {"columns": ["metric", "value"], "data": [list(r) for r in rows]},
                             "summary_table.json")  # fmt: skip
        self.client.log_dict(self.run_id, summary, "summary.json")

    def close(self) -> None:
        if self.run_id is not None:
            run_id, self.run_id = self.run_id, None
            self.client.set_terminated(run_id)
