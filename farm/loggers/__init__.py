"""Run loggers: the run's metrics as it goes, and its summary at the end, sent to the
tools RL users already watch (W&B, MLflow). Optional (``farm[wandb]``, ``farm[mlflow]``),
off by default, each library imported only when its sink is configured.

A sink is a small class (:class:`RunLogger`); :class:`RunLoggers` fans out to them and
guards the run against them: a sink that fails (library missing, server down, bad
credentials) is reported once and disabled, and the run goes on. No Ray here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from farm.loggers.config import LoggerConfig, MlflowLoggerConfig, WandbLoggerConfig
from farm.loggers.flatten import scalars, summary_rows

log = logging.getLogger(__name__)

__all__ = ["LoggerConfig", "MlflowLoggerConfig", "RunLogger", "RunLoggers", "WandbLoggerConfig", "make_logger",
           "scalars", "summary_rows"]  # fmt: skip


class RunLogger(Protocol):
    kind: str

    def start(self, run_id: str, config: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_summary(self, summary: dict[str, Any], rows: list[tuple[str, str]]) -> None:
        """The final summary: its scalars and the summary table (metric, value)."""

    def close(self) -> None: ...


def make_logger(cfg: LoggerConfig, out_dir: str) -> RunLogger:
    if isinstance(cfg, WandbLoggerConfig):
        # optional extra: a logger's client (wandb, mlflow) loads only when configured
        from farm.loggers.wandb_logger import WandbLogger

        return WandbLogger(cfg, out_dir)
    # optional extra: a logger's client (wandb, mlflow) loads only when configured
    from farm.loggers.mlflow_logger import MlflowLogger

    return MlflowLogger(cfg)


def _name(cfg: LoggerConfig) -> str:
    where = cfg.project if isinstance(cfg, WandbLoggerConfig) else (cfg.tracking_uri or "default tracking URI")
    return f"{cfg.kind} ({where})"


class RunLoggers:
    """The configured sinks, each disabled at its first failure (reported once)."""

    def __init__(self, note: Callable[[str], None] | None = None) -> None:
        self.note = note or log.warning
        self.sinks: list[RunLogger] = []
        self.names: list[str] = []
        self.intervals: list[float] = []
        self.failed: dict[str, str] = {}  # sink name -> why it was disabled
        self._off: set[int] = set()
        self._last: list[float] = []
        self._pending: list[tuple[dict[str, float], int] | None] = []

    @classmethod
    def from_config(cls, configs: Sequence[LoggerConfig], out_dir: str, *,
                    note: Callable[[str], None] | None = None) -> RunLoggers:  # fmt: skip
        made = cls(note)
        for cfg in configs:
            try:
                made.add(make_logger(cfg, out_dir), name=_name(cfg), interval_s=cfg.interval_s)
            except Exception as exc:  # noqa: BLE001 - a logger never fails the run
                made._report(_name(cfg), "cannot be set up", exc)
        return made

    def add(self, sink: RunLogger, *, name: str, interval_s: float = 0.0) -> None:
        self.sinks.append(sink)
        self.names.append(name)
        self.intervals.append(interval_s)
        self._last.append(float("-inf"))
        self._pending.append(None)

    def __bool__(self) -> bool:
        return len(self._off) < len(self.sinks)

    def _report(self, name: str, what: str, exc: BaseException) -> None:
        self.failed[name] = f"{type(exc).__name__}: {exc}"
        self.note(f"logger {name} {what} ({self.failed[name][:300]}); disabled for the rest of the run")

    def _each(self, what: str, call: Callable[[int, RunLogger], None]) -> None:
        for i, sink in enumerate(self.sinks):
            if i in self._off:
                continue
            try:
                call(i, sink)
            except Exception as exc:  # noqa: BLE001 - a logger never fails the run
                self._off.add(i)
                self._report(self.names[i], f"failed to {what}", exc)
                try:
                    sink.close()
                except Exception:  # noqa: BLE001 - already reported and disabled
                    pass

    def start(self, run_id: str, config: dict[str, Any]) -> None:
        self._each("start", lambda i, s: s.start(run_id, config))

    def log_metrics(self, metrics: dict[str, float], step: int, *, force: bool = False) -> None:
        """Send ``metrics`` to each sink whose interval has passed (the latest is kept for the rest)."""
        now = time.monotonic()

        def send(i: int, sink: RunLogger) -> None:
            if force or now - self._last[i] >= self.intervals[i]:
                sink.log_metrics(metrics, step)
                self._last[i], self._pending[i] = now, None
            else:
                self._pending[i] = (metrics, step)

        self._each("log metrics", send)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """Flush what the interval held back, send the summary, close every sink (once)."""

        def flush(i: int, sink: RunLogger) -> None:
            pending = self._pending[i]
            if pending is not None:
                self._pending[i] = None
                sink.log_metrics(*pending)

        self._each("log metrics", flush)
        if summary is not None:
            rows = summary_rows(summary)
            self._each("log the summary", lambda i, s: s.log_summary(summary, rows))
        self._each("close", lambda i, s: s.close())
        self._off.update(range(len(self.sinks)))
