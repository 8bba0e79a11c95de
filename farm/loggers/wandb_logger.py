"""W&B sink: ``wandb.init`` at the run's start, ``run.log`` per metrics step, the summary's
scalars into ``run.summary`` and its table as a ``wandb.Table`` at the end."""

from __future__ import annotations

from typing import Any

from farm.loggers.config import WandbLoggerConfig
from farm.loggers.flatten import scalars


class WandbLogger:
    kind = "wandb"

    def __init__(self, cfg: WandbLoggerConfig, out_dir: str) -> None:
        import wandb  # the optional extra: a missing library disables this sink, not the run

        self.wandb = wandb
        self.cfg = cfg
        self.dir = cfg.dir or out_dir
        self.run: Any = None

    def start(self, run_id: str, config: dict[str, Any]) -> None:
        c = self.cfg
        self.run = self.wandb.init(
            project=c.project, entity=c.entity, name=c.name or run_id, mode=c.mode, dir=self.dir, tags=c.tags or None,
            config=config, job_type="rollouts", reinit="create_new",
        )  # fmt: skip

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_summary(self, summary: dict[str, Any], rows: list[tuple[str, str]]) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in scalars(summary).items()})
        self.run.log({"summary_table": self.wandb.Table(columns=["metric", "value"], data=[list(r) for r in rows])})

    def close(self) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish()
