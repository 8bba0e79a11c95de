"""The ``loggers`` list of the run config: where else the run's metrics go (none by default)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class WandbLoggerConfig(BaseModel):
    """Weights & Biases (``pip install 'farm[wandb]'``); the API key comes from the
    environment (``WANDB_API_KEY``) or ``wandb login``, never from this config."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["wandb"] = Field(default="wandb", description="selects this logger: Weights & Biases")
    project: str = Field(default="farm", description="W&B project")
    entity: str | None = Field(default=None, description="W&B entity (team or user); default: the key's")
    name: str | None = Field(default=None, description="run name; default: the farm run_id")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        default=None, description="wandb.init mode; default: wandb's (WANDB_MODE, else online)"
    )
    dir: str | None = Field(default=None, description="where wandb keeps its files; default: the output dir")
    tags: list[str] = Field(default_factory=list, description="tags attached to the W&B run")
    interval_s: float = Field(
        default=5.0, ge=0, description="metrics are sent at most this often while the run goes (and at its end)"
    )


class MlflowLoggerConfig(BaseModel):
    """MLflow (``pip install 'farm[mlflow]'``: the mlflow-skinny client)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["mlflow"] = Field(default="mlflow", description="selects this logger: MLflow")
    tracking_uri: str | None = Field(
        default=None, description="a server (http://...) or a file store (file:///path); default: MLflow's "
        "(MLFLOW_TRACKING_URI, else ./mlruns)",
    )  # fmt: skip
    experiment: str = Field(default="farm", description="experiment name (created when missing)")
    run_name: str | None = Field(default=None, description="default: the farm run_id")
    interval_s: float = Field(
        default=5.0, ge=0, description="metrics are sent at most this often while the run goes (and at its end)"
    )


LoggerConfig = Annotated[WandbLoggerConfig | MlflowLoggerConfig, Field(discriminator="kind")]
