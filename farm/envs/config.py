"""Envs section: environment snapshots (built once per environment, cloned per sandbox)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EnvsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description="start every agent and grading sandbox from its environment's snapshot (built once, on "
        "first use or with `farm envs build`); False: every sandbox materializes the repo and runs setup itself",
    )
    cache_dir: str = Field(
        default="~/.cache/farm/envs",
        description="where snapshots live (one directory per environment key); per node on a Ray cluster",
    )
    mount_root: str = Field(
        default="/workspace",
        description="a task's workdir (relative) appears at <mount_root>/<workdir> inside snapshot-backed sandboxes; "
        "it is built at that same path (venvs hold absolute paths)",
    )
    build_timeout_s: float = Field(
        default=7200.0, gt=0, description="how long a rollout waits for another process's build of its environment"
    )
    e2b_templates: bool = Field(
        default=True,
        description="E2B backend: build one template per environment (the e2b SDK's template builder) and create "
        "every sandbox from it; False: every E2B sandbox materializes and sets up itself",
    )
    max_size_bytes: int | None = Field(
        default=None, ge=0,
        description="after each build, least-recently-used snapshots are removed until the cache fits, container "
        "images' layers among them (an image before its layers; none a live sandbox uses); None: never",
    )
