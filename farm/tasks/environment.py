"""Who provides a row's environment: a dataset row never runs on farm's own Python unasked.

A row of a dataset made for docker (SWE-bench, SWE-Gym, SWE-smith, R2E-Gym) brings no
environment of its own: its dataset's image has the repository's dependencies. Without
something standing in for that image, its setup, tests and agent would find only the
interpreter ``tasks.python: auto`` puts first on PATH, farm's own (with pytest and farm's
packages, none of the repository's): tests that cannot import the project, or worse, tests
that pass against packages farm happens to have. So when such a row loads, one of these
must provide its environment:

- **a recipe** (``tasks.recipes``: farm's recipe book or a file of the user's) for its
  repository and version;
- **setup commands** of the row's own (``setup_commands`` / ``base_setup_commands``);
- **an image**: one the row names (``image``, ``image_name``, ``docker_image``, an E2B
  template, an image workspace), or, where the sandboxes start from images a row's format
  names by convention (SWE-bench's per-instance image on E2B), that one;

or the user says its tests run on the host: ``tasks.python`` set to anything but ``auto``
(``host``: farm's own interpreter, knowingly; a version or a path: that interpreter).
Otherwise the row is refused with a message naming the three ways (``environment_error``).

farm's own format is exempt: its rows are written for farm, whose documented contract is that
their commands run with ``tasks.python`` first on PATH (the demo tasks are pure Python and
need only pytest, which farm's interpreter has).
"""

from __future__ import annotations

from farm.tasks.model import GitSource, ImageSource, Task

# The formats whose rows expect a docker image as their environment (metadata "source").
IMAGE_DATASETS = ("swebench", "swegym", "swesmith", "swerebench", "r2e")
# The fields a dataset row names its image in (SWE-bench / SWE-Gym forks, SWE-smith, R2E-Gym).
IMAGE_FIELDS = ("image", "image_name", "docker_image")
# Set in a task's metadata when its docker_image was derived from its id, not named by the row.
BY_CONVENTION = "docker_image_by_convention"


def provider_of(task: Task, *, convention_images: bool = False) -> str | None:
    """What provides ``task``'s environment: ``recipe``, ``setup``, ``image``, or None."""
    md = task.metadata
    if md.get("recipe"):
        return "recipe"
    if task.setup_commands or task.base_setup_commands:
        return "setup"
    if task.image or isinstance(task.workspace, ImageSource):
        return "image"
    if md.get("docker_image") and (convention_images or not md.get(BY_CONVENTION)):
        return "image"
    return None


def environment_error(task: Task, *, python: str, convention_images: bool = False) -> str | None:
    """Why ``task`` cannot load (None: something provides its environment, or the user
    said where its tests run, or it is a row of farm's own format)."""
    source = task.metadata.get("source")
    if source not in IMAGE_DATASETS or python != "auto" or task.python is not None:
        return None
    if provider_of(task, convention_images=convention_images) is not None:
        return None
    src = task.workspace
    repo = src.repo if isinstance(src, GitSource) and src.repo else "its repository"
    version = task.metadata.get("version")
    at = f" {version}" if version else ""
    return (
        f"no environment for this row: nothing provides {repo}{at}'s dependencies, so its tests would run on "
        "farm's own Python. Provide one: a recipe for it (tasks.recipes), setup commands in "
        f"the row (setup_commands / base_setup_commands), or an image the row names ({' / '.join(IMAGE_FIELDS)}); "
        "or, to run its tests on the host's Python knowingly, set tasks.python: host"
    )
