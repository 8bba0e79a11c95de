"""The configuration reference, generated from the pydantic models (never written by hand).

``config_sections()`` walks ``FarmConfig``'s model tree (nested sections, optional
sections, and the variants of a discriminated union: ``loggers[]`` by ``kind``,
``endpoints.<name>`` by ``kind``) into one :class:`ConfigKey` per key: its dotted path,
type, default, constraints (``ge``/``gt``/``le``/``lt``, lengths, patterns; ``Literal``
choices are the type) and description. ``render_markdown()`` is
``docs/reference/config.md`` (``farm config reference -o ...``; a test keeps the
committed file equal to it), ``json_schema()`` the JSON Schema editors validate a config
file with, ``effective_yaml()`` what ``farm config show`` prints: the resolved config,
secrets never (a config names the environment variables keys are read from, and a
header or env value that looks like a credential is masked).
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from farm.config import FarmConfig

REFERENCE_PATH = "docs/reference/config.md"
SCHEMA_PATH = "docs/reference/config.schema.json"
GENERATE = "farm config reference -o docs/reference/config.md --schema docs/reference/config.schema.json"
MASKED = "<masked>"
# dict-valued keys whose values may carry credentials (HTTP headers, env of the CLI)
_SECRET_NAME = re.compile(r"auth|key|token|secret|passw|cookie|credential|session", re.I)


@dataclass(frozen=True)
class ConfigKey:
    path: str  # dotted, as --set takes it: "sandbox.local.limits.memory_bytes", "loggers[].project"
    type: str
    default: str  # rendered; "required" when there is none
    constraints: str
    description: str
    section: str | None = None  # a key that is itself a section: that section's path


@dataclass
class ConfigSection:
    path: str  # "" for the top level
    model: type[BaseModel]
    doc: str
    variant: str | None = None  # a union variant: "kind: wandb"
    keys: list[ConfigKey] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        base = re.sub(r"[^a-z0-9]+", "-", (self.path or "top-level").lower()).strip("-")
        return base + (f"-{self.variant.split(': ')[-1]}" if self.variant else "")

    @property
    def title(self) -> str:
        return (f"`{self.path}`" if self.path else "top level") + (f" ({self.variant})" if self.variant else "")


# --- the walk ----------------------------------------------------------------------
def _strip(ann: Any) -> Any:
    """``Annotated[X, ...]`` -> X."""
    while get_origin(ann) is typing.Annotated:
        ann = get_args(ann)[0]
    return ann


def _is_union(ann: Any) -> bool:
    return get_origin(ann) in (Union, types.UnionType)


def _model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _variants(ann: Any) -> list[type[BaseModel]]:
    """The models of a (discriminated) union, or of one model."""
    ann = _strip(ann)
    if _model(ann):
        return [ann]
    if _is_union(ann):
        return [m for a in get_args(ann) for m in _variants(a)]
    return []


def _container(ann: Any) -> tuple[str, Any] | None:
    """("list", item) / ("dict", value) / ("optional", model) / ("model", model) when ``ann``
    holds config sections, else None (a plain value)."""
    ann = _strip(ann)
    if _model(ann):
        return "model", ann
    origin = get_origin(ann)
    if origin is list and _variants(get_args(ann)[0]):
        return "list", get_args(ann)[0]
    if origin is dict and _variants(get_args(ann)[1]):
        return "dict", get_args(ann)[1]
    if _is_union(ann):
        rest = [a for a in get_args(ann) if a is not type(None)]
        if len(rest) == 1 and _model(_strip(rest[0])):
            return "optional", _strip(rest[0])
    return None


def type_name(ann: Any) -> str:
    """A field's type as a reader writes it in YAML: ``int | null``, ``"arrow" | "parquet"``,
    ``list[str]``, ``dict[str, str]``, a section's class name."""
    ann = _strip(ann)
    if ann is type(None):
        return "null"
    if ann is Any:
        return "any"
    origin = get_origin(ann)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in get_args(ann))
    if _is_union(ann):
        return " | ".join(type_name(a) for a in get_args(ann))
    if origin in (list, tuple, set, frozenset):
        return f"list[{', '.join(type_name(a) for a in get_args(ann) if a is not Ellipsis)}]"
    if origin is dict:
        k, v = get_args(ann)
        return f"dict[{type_name(k)}, {type_name(v)}]"
    if _model(ann):
        return ann.__name__
    return getattr(ann, "__name__", str(ann))


# annotated_types' bounds: (metadata class, its attribute, how the reference writes it)
_BOUNDS = (
    (annotated_types.Ge, "ge", ">= {}"), (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Le, "le", "<= {}"), (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.MinLen, "min_length", "length >= {}"), (annotated_types.MaxLen, "max_length", "length <= {}"),
)  # fmt: skip


def constraints(info: FieldInfo) -> str:
    """``>= 1``, ``> 0``, ``<= 1``, lengths, patterns, from the field's metadata."""
    out = []
    for m in info.metadata:
        shown = next((fmt.format(getattr(m, attr)) for kind, attr, fmt in _BOUNDS if isinstance(m, kind)), None)
        if shown is None and getattr(m, "pattern", None):
            shown = f"matches `{m.pattern}`"
        if shown is not None:
            out.append(shown)
    return ", ".join(out)


def _bytes_hint(key: str, value: Any) -> str:
    if "bytes" not in key or not isinstance(value, int) or isinstance(value, bool) or value < 1 << 20:
        return ""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if value % size == 0:
            return f" ({value // size} {unit})"
    return ""


def default_text(name: str, info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(value, default=str) + _bytes_hint(name, value)


def _doc(model: type[BaseModel]) -> str:
    doc = model.__doc__ or ""
    if doc.startswith(BaseModel.__doc__ or "\0"):
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def config_sections(root: type[BaseModel] = FarmConfig) -> list[ConfigSection]:
    """Every section of ``root``'s tree, depth first, with its keys."""
    out: list[ConfigSection] = []

    def walk(model: type[BaseModel], path: str, variant: str | None = None) -> None:
        section = ConfigSection(path, model, _doc(model), variant)
        out.append(section)
        children: list[tuple[type[BaseModel], str, str | None]] = []
        for name, info in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            holder = _container(info.annotation)
            sub_path = None
            if holder is not None:
                kind, inner = holder
                sub_path = {"list": f"{key}[]", "dict": f"{key}.<name>"}.get(kind, key)
                variants = _variants(inner)
                for v in variants:
                    tag = _tag(v) if len(variants) > 1 else None
                    children.append((v, sub_path, tag))
            section.keys.append(ConfigKey(
                path=key, type=type_name(info.annotation), default=default_text(name, info),
                constraints=constraints(info), description=info.description or "", section=sub_path,
            ))  # fmt: skip
        for child, sub_path, tag in children:
            walk(child, sub_path, tag)

    walk(root, "")
    return out


def _tag(model: type[BaseModel]) -> str:
    """``kind: wandb``: the discriminator value that selects a union variant."""
    for name, info in model.model_fields.items():
        if get_origin(_strip(info.annotation)) is Literal and name in ("kind", "type"):
            return f"{name}: {get_args(_strip(info.annotation))[0]}"
    return model.__name__


def config_keys(root: type[BaseModel] = FarmConfig) -> list[ConfigKey]:
    return [k for s in config_sections(root) for k in s.keys]


# --- markdown ------------------------------------------------------------------------
_INTRO = """\
Every key of a run's config (`FarmConfig`, `farm/config.py`), generated from its pydantic models by
`{generate}`: do not edit this page by hand (a test fails when it differs from what the models say).

**Setting keys.** A run is one YAML file (`farm run configs/local.yaml`; every key is optional, the
defaults below apply) plus `--set a.b=c` overrides, applied after the file, in order; the value is
parsed as YAML (`--set rollout.n_samples=8`, `--set engine.worker_urls='[http://a:30000]'`). Every
section rejects unknown keys. `farm config show [--config F] [--set k=v ...]` prints the config a
command would run with; `farm config schema` prints its JSON Schema.

**Secrets are never config.** Keys are read from environment variables at the entry point:
`E2B_API_KEY` (`sandbox.backend: e2b`), the variable a hosted endpoint's `api_key_env` names,
`WANDB_API_KEY` / `MLFLOW_TRACKING_URI` (the loggers' own), `FARM_SERVE_TOKEN` (`farm serve`).
`farm config show` prints those names and whether they are set, never their values.

**Editor support.** `farm config schema > farm-config.schema.json` writes the JSON Schema (this
directory holds a copy: `config.schema.json`). With VS Code's YAML extension (redhat.vscode-yaml),
put this first line in a config file to get completion, hover docs and validation:

```yaml
# yaml-language-server: $schema=../docs/reference/config.schema.json
```

(the path is relative to the YAML file; the configs under `configs/` carry this line), or map a
glob in the editor's settings: `"yaml.schemas": {{"docs/reference/config.schema.json": "configs/*.yaml"}}`.

Columns: the key as `--set` takes it (`loggers[]` is an item of the `loggers` list,
`endpoints.<name>` an entry of the `endpoints` mapping, each variant chosen by its `kind`); the type
(`null` = YAML `null`/`~`; quoted values are the only choices); the default (`required`: none); the
constraints pydantic checks.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(root: type[BaseModel] = FarmConfig) -> str:
    sections = config_sections(root)
    anchors = {}
    for s in sections:
        anchors.setdefault(s.path, s.anchor)
    lines = ["# Configuration reference", "", _INTRO.format(generate=GENERATE), "## Sections", ""]
    paths = {s.path for s in sections if s.path}
    for s in sections:  # indented under the sections it is inside of
        depth = sum(1 for p in paths if s.path.startswith((p + ".", p + "[]")))
        lines.append(f"{'  ' * depth}- [{s.title}](#{s.anchor}): {len(s.keys)} key{'s' * (len(s.keys) != 1)}")
    total = sum(len(s.keys) for s in sections)
    lines += ["", f"{total} keys in {len(sections)} sections.", ""]
    for s in sections:
        lines += [f'<a id="{s.anchor}"></a>', "", f"## {s.title}", ""]
        lines.append(f"`{s.model.__name__}`" + (f": {s.doc}" if s.doc else ""))
        lines += ["", "| key | type | default | constraints | description |", "|---|---|---|---|---|"]
        for k in s.keys:
            name = f"`{k.path}`"
            kind = _cell(k.type)
            if k.section is not None:
                kind = f"[{_cell(k.type)}](#{anchors.get(k.section, '')})"
            lines.append(f"| {name} | {kind} | {_cell(k.default)} | {_cell(k.constraints)} | {_cell(k.description)} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


# --- JSON Schema -----------------------------------------------------------------------
def json_schema(root: type[BaseModel] = FarmConfig) -> dict[str, Any]:
    """pydantic's JSON Schema of the config (descriptions, defaults, enums, bounds;
    ``additionalProperties: false`` everywhere), as editors read it."""
    schema = root.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": "farm run config"}


def schema_text(root: type[BaseModel] = FarmConfig) -> str:
    return json.dumps(json_schema(root), indent=2, sort_keys=False) + "\n"


# --- farm config show ----------------------------------------------------------------------
def _mask(node: Any, parent: str = "") -> Any:
    """Credentials masked: a header or CLI env value under a secret-looking name, and the
    value of a secret-looking ``--flag`` in an argument list (``extra_args``)."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            secretish = parent in ("headers", "extra_env") and _SECRET_NAME.search(str(k))
            out[k] = MASKED if secretish and isinstance(v, str) and v else _mask(v, str(k))
        return out
    if isinstance(node, list):
        if parent != "extra_args":
            return [_mask(v, parent) for v in node]
        args, hide_next = [], False
        for arg in node:
            flag, eq, _ = str(arg).partition("=")
            secret_flag = flag.startswith("-") and bool(_SECRET_NAME.search(flag))
            args.append(MASKED if hide_next else f"{flag}={MASKED}" if secret_flag and eq else arg)
            hide_next = secret_flag and not eq
        return args
    return node


def secret_env_names(cfg: FarmConfig) -> list[str]:
    """The environment variables this config reads secrets from (their names only)."""
    names = []
    if cfg.sandbox.backend == "e2b":
        names.append("E2B_API_KEY")
    for ep in cfg.endpoints.values():
        name = getattr(ep, "api_key_env", None)
        if name:
            names.append(name)
    if any(lg.kind == "wandb" for lg in cfg.loggers):
        names.append("WANDB_API_KEY")
    return list(dict.fromkeys(names))


def effective_yaml(cfg: FarmConfig, environ: Mapping[str, str]) -> str:
    """The resolved config as YAML (what the command would run with), credentials masked,
    then the secret-carrying environment variables it reads: set or not, never their values."""
    body = yaml.safe_dump(_mask(cfg.model_dump(mode="json")), sort_keys=False, width=120)
    names = secret_env_names(cfg)
    if names:
        body += "# secrets, read from the environment (values never printed):\n"
        body += "".join(f"#   {n}: {'set' if environ.get(n) else 'NOT SET'}\n" for n in names)
    return body
