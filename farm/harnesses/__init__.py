"""farm.harnesses: the coding-agent CLIs a rollout runs (Claude Code, Codex, OpenCode).

``make_harness(cfg)`` builds the configured one; see ``base.py`` for the lifecycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from farm.harnesses.base import Harness
    from farm.harnesses.config import HarnessConfig


def make_harness(cfg: HarnessConfig, *, npm: str = "npm") -> Harness:
    """The harness named by ``cfg.name`` (implementations imported lazily)."""
    if cfg.name == "claude_code":
        from farm.harnesses.claude_code import ClaudeCodeHarness as cls  # only the chosen harness loads
    elif cfg.name == "codex":
        from farm.harnesses.codex import CodexHarness as cls  # only the chosen harness loads
    elif cfg.name == "opencode":
        from farm.harnesses.opencode import OpenCodeHarness as cls  # only the chosen harness loads
    else:  # pragma: no cover - the config's Literal forbids it
        raise ValueError(f"unknown harness {cfg.name!r}")
    return cls(cfg, npm=npm)
