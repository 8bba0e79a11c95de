"""Old module paths of modules that moved (issue 29: to ``farm/output/``, ``rollout.parts``, ``single.placement``), kept for one
release: importing one warns (DeprecationWarning) and hands out the new module's objects
themselves. A finder rather than a file left at each old path, so git records each move as
a rename and a merge carries an edit made to the old file over to the new one."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

MOVED = {  # old module -> new module
    "farm.trajectory.reader": "farm.output.shard_reader",
    "farm.trajectory.output": "farm.output.reader",
    "farm.trajectory.torch_data": "farm.output.torch_data",
    "farm.trajectory.config": "farm.output.config",
    "farm.rollout.store": "farm.output.writer",
    "farm.rollout.table": "farm.output.rows",
    "farm.rollout.artifacts": "farm.output.artifacts",
    "farm.rollout.group_reader": "farm.output.groups",
    "farm.rollout.groups": "farm.output.groups",
    "farm.rollout.parts": "farm.rollout.actor_layers",  # FarmParts is ActorLayers
    "farm.rollout.outdir": "farm.output.outdir",
    "farm.single.placement": "farm.single.runtime",  # in this process or on Ray, not node placement
}
# names an old module handed out that now live in another new module
EXTRA = {"farm.rollout.artifacts": {"ArtifactsConfig": "farm.output.config"}}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Asked last (after the path finder found no file): an old name becomes a module
    holding the new module's names."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new}", DeprecationWarning, stacklevel=2)
        home = importlib.import_module(new)
        module.__dict__.update({k: v for k, v in vars(home).items() if not k.startswith("__")})
        for name, where in EXTRA.get(module.__name__, {}).items():
            setattr(module, name, getattr(importlib.import_module(where), name))


def install() -> None:
    """Once per process (farm.trajectory, farm.rollout and farm.single call it: a submodule's
    package is always imported first)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
