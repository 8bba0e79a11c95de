"""Tokenizer specs: an HF path/name, or ``builtin:<name>`` built offline into a cache dir.

The one place that turns ``engine.tokenizer`` into something ``AutoTokenizer`` loads, so
the gateway, the scripted workers and the tests agree on the same files.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from farm.errors import ConfigError
import json

BUILTIN_PREFIX = "builtin:"
BUILTINS = ("farm-test",)


def default_cache_dir() -> Path:
    """``~/.cache/farm/tokenizers``."""
    return Path.home() / ".cache" / "farm" / "tokenizers"


def resolve_tokenizer(spec: str, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """A path or HF name ``AutoTokenizer.from_pretrained`` accepts.

    ``builtin:farm-test`` is built (once, a few seconds) into ``<cache_dir>/farm-test``;
    anything else is returned unchanged (a local directory or a hub name).
    """
    if not spec.startswith(BUILTIN_PREFIX):
        return spec
    name = spec[len(BUILTIN_PREFIX):]
    if name not in BUILTINS:
        raise ConfigError(f"unknown builtin tokenizer {spec!r}; known: {[BUILTIN_PREFIX + b for b in BUILTINS]}")
    # the built-in test tokenizer is built only when named
    from farm.modeltext.builtin_tokenizer import build_tokenizer

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    # Actors on one machine may resolve the same builtin at once: build under a lock.
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return str(build_tokenizer(root / name))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_tokenizer(spec: str, cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """The HF tokenizer for ``spec`` (see :func:`resolve_tokenizer`)."""
    path = resolve_tokenizer(spec, cache_dir)
    try:
        if _names_generic_fast(path):
            # The class AutoTokenizer would pick anyway, without importing its mapping of every
            # model's config (which imports torch: ~1.2 s and ~300 MB per gateway and worker).
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(path)
        # heavy: transformers' AutoTokenizer (its model mapping imports torch)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load tokenizer {spec!r} ({path}): {exc}") from exc


def _names_generic_fast(path: str) -> bool:
    """A local tokenizer directory whose config names the generic fast tokenizer class
    (``builtin:`` tokenizers do; a model's own class, or a hub name, goes through AutoTokenizer)."""
    try:
        config = json.loads((Path(path) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("tokenizer_class") == "PreTrainedTokenizerFast" \
        and (Path(path) / "tokenizer.json").is_file()
