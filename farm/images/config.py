"""``tasks.images``: container images as task environments (``farm.images``).

Rows of SWE-bench, SWE-Gym, SWE-smith, R2E-Gym and SWE-rebench name an image (``image``,
``image_name``, ``docker_image``) or one follows from the instance id by the dataset's
convention (``datasets.<name>.name``). Local sandboxes pull it from its registry, unpack its
layers into the environment store (``envs.cache_dir``, under ``envs.max_size_bytes``) and run
with the image's file system as their root; E2B creates from it as a template.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CONDA_TESTBED = "source /opt/miniconda3/bin/activate && conda activate testbed"
SWEBENCH_NAME = "swebench/sweb.eval.x86_64.{instance_id_docker}:latest"
SWEGYM_NAME = "xingyaoww/sweb.eval.x86_64.{instance_id_docker}:latest"
_FIELDS = re.compile(r"\{([a-z_0-9]+)\}")
NAME_FIELDS = ("instance_id", "instance_id_docker", "repo", "repo_docker", "base_commit", "commit8")


class DatasetImages(BaseModel):
    """How one dataset's images are laid out and named."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None,
        description="the image of a row that names none, from its fields: {instance_id}, {instance_id_docker} "
        "(lower case, '__' -> '_1776_', as SWE-bench's images are named), {repo}, {repo_docker} (owner_1776_name), "
        "{base_commit}, {commit8}; None: only rows that name their image use one",
    )
    workdir: str = Field(default="/testbed", description="where the image holds the repository")
    activate: str | None = Field(
        default=CONDA_TESTBED,
        description="bash run once when the image is first used: the environment it leaves (PATH, CONDA_PREFIX, "
        "...) is every command's in its sandboxes, the agent's tool calls included; None: the image's own Env",
    )

    held_out_tests: str | None = Field(
        default=None,
        description="a directory of the image holding the tests the row is graded with, kept out of the repository "
        "(R2E-Gym's /r2e_tests): linked into the workdir under its name for each test run only, as the dataset's "
        "harness does",
    )

    @field_validator("name")
    @classmethod
    def _known_fields(cls, value: str | None) -> str | None:
        for field in _FIELDS.findall(value or ""):
            if field not in NAME_FIELDS:
                raise ValueError(f"unknown field {{{field}}} in an image name template (known: {', '.join(NAME_FIELDS)})")
        return value


class ImageDatasets(BaseModel):
    """Each row format's image layout (``tasks.format``, or what ``auto`` detects)."""

    model_config = ConfigDict(extra="forbid")

    swebench: DatasetImages = Field(default_factory=DatasetImages, description="SWE-bench's images")
    swegym: DatasetImages = Field(default_factory=DatasetImages, description="SWE-Gym's (SWE-bench's layout)")
    swesmith: DatasetImages = Field(default_factory=DatasetImages, description="SWE-smith's (one per repository)")
    swerebench: DatasetImages = Field(default_factory=DatasetImages, description="SWE-rebench's (SWE-bench's layout)")
    r2e: DatasetImages = Field(
        default_factory=lambda: DatasetImages(activate=None, held_out_tests="/r2e_tests"),
        description="R2E-Gym's (rows name their docker_image; its Python environment is the repository's .venv)",
    )


class ImagesConfig(BaseModel):
    """``tasks.images``: where images come from and when rows run in them."""

    model_config = ConfigDict(extra="forbid")

    prefer: Literal["image", "recipe"] = Field(
        default="image",
        description="a row with an image AND a recipe for its repository-version: which gives its environment "
        "(a row with only one of them uses that one)",
    )
    registry: str = Field(
        default="docker.io", description="the registry of image names that name none (as docker reads 'ubuntu:22.04')"
    )
    mirrors: dict[str, str] = Field(
        default_factory=dict,
        description="registry -> the URL pulls go to instead (a pull-through cache, a local copy): "
        "{docker.io: 'http://127.0.0.1:5000'}; a mirror that lacks the image is an error, not a fallback",
    )
    insecure: list[str] = Field(
        default_factory=list,
        description="registries (host:port) reached over plain HTTP; a mirror's URL says its own scheme",
    )
    pull: Literal["missing", "always", "never"] = Field(
        default="missing",
        description="'missing': a tag pulled before on this node is used as it was; 'always': the registry is "
        "asked once per process what the tag is now (layers already here are not fetched again); 'never': only "
        "images already on this node",
    )
    platform: str = Field(default="linux/amd64", description="the platform picked from a multi-platform image index")
    docker_config: str | None = Field(
        default="~/.docker/config.json",
        description="credentials as docker keeps them (auths, credHelpers, credsStore); the variable "
        "FARM_REGISTRY_AUTH (a docker config's JSON), read by the entry point, comes first",
    )
    datasets: ImageDatasets = Field(
        default_factory=ImageDatasets,
        description="per dataset (the row format): the name template of rows that name no image, the workdir, the "
        "activation",
    )
    connect_timeout_s: float = Field(default=30.0, gt=0, description="connecting to a registry")
    read_timeout_s: float = Field(
        default=120.0, gt=0, description="a registry that sends nothing for this long fails the request (never a hang)"
    )
    retries: int = Field(default=4, ge=0, description="retries of a failed request (network, 5xx); a blob resumes")
    concurrency: int = Field(default=3, ge=1, description="layers downloaded and unpacked at once per image")
    progress_s: float = Field(default=10.0, gt=0, description="a long pull logs its progress this often")

    def dataset(self, name: str) -> DatasetImages:
        """The layout of ``name``'s images (another format's: the workdir only, no activation)."""
        found = getattr(self.datasets, name, None)
        return found if isinstance(found, DatasetImages) else DatasetImages(activate=None)
