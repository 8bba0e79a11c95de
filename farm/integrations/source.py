"""Where a trainer adapter takes its groups from: a *group source*.

Every adapter in ``farm.integrations`` pulls ``Group`` objects (``farm.output.groups``)
through one small protocol, ``GroupSource.next_groups(k, timeout=None)``, the method
``farm.Farm`` has in continuous mode. ``as_group_source`` accepts

- anything with ``next_groups`` (a ``farm.Farm``, or your own object): used as is;
- a ``GroupReader`` over an output directory: polled, so ``timeout`` is honoured while
  a run is still writing;
- any other iterable of ``Group`` (a list, ``GroupReader.read()``, a generator such as
  ``reader.follow(...)``): drawn from in order; a blocking iterator can only be asked,
  so its own stop/timeout governs how long a call waits.

``next_groups`` returns at most ``k`` groups, fewer when ``timeout`` passed, and an
empty list once the source is exhausted (as ``Farm.next_groups`` does).

Sharding (several DataLoader workers, DDP ranks, trainer processes) is by a stable hash
of an id (``shard_of``, from ``farm.output.torch_data``), so every process decides
alone, with no coordination, which rollouts or groups are its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from farm.output.cursor import GroupCursor
from farm.output.groups import Group, GroupReader
from farm.output.torch_data import shard_of

__all__ = ["GroupSource", "IterableSource", "ReaderSource", "as_group_source", "iter_groups", "shard_of"]


@runtime_checkable
class GroupSource(Protocol):
    def next_groups(self, k: int, timeout: float | None = None) -> list[Group]: ...


class ReaderSource:
    """A ``GroupReader`` as a source: polls its output directory for done groups."""

    def __init__(self, reader: GroupReader, *, poll_interval: float = 0.5) -> None:
        self.reader, self.poll_interval = reader, poll_interval
        self._ready: list[Group] = []

    def next_groups(self, k: int, timeout: float | None = None) -> list[Group]:
        """Up to ``k`` groups. ``timeout=None`` waits until there are ``k``; a finished
        output directory never grows, so pass a timeout (or use ``read()``) there."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._ready.extend(self.reader.poll())
            if len(self._ready) >= k or (deadline is not None and time.monotonic() >= deadline):
                break
            wait = self.poll_interval if deadline is None else min(self.poll_interval, deadline - time.monotonic())
            time.sleep(max(0.0, wait))
        out, self._ready = self._ready[:k], self._ready[k:]
        return out

    def position(self) -> GroupCursor:
        """The reader's position with the groups polled but not taken yet handed out
        first on resume (``seek``)."""
        return self.reader.position(unconsumed=self._ready)

    def seek(self, cursor: GroupCursor) -> None:
        """Continue from ``cursor`` (before the first ``next_groups``): raises
        ``CursorError`` when it no longer fits the directory."""
        self.reader.seek(cursor)


class IterableSource:
    """Any iterable of groups as a source (drawn from in order, never re-read)."""

    def __init__(self, groups: Iterable[Group]) -> None:
        self._it: Iterator[Group] = iter(groups)

    def next_groups(self, k: int, timeout: float | None = None) -> list[Group]:
        out: list[Group] = []
        for g in self._it:
            out.append(g)
            if len(out) >= k:
                break
        return out


def as_group_source(obj: Any, *, poll_interval: float = 0.5) -> GroupSource:
    """``obj`` as a ``GroupSource`` (see the module docstring for what is accepted)."""
    if isinstance(obj, GroupSource):
        return obj
    if isinstance(obj, GroupReader):
        return ReaderSource(obj, poll_interval=poll_interval)
    if isinstance(obj, (str, bytes, os.PathLike)):
        raise TypeError(f"{obj!r} is a path: pass GroupReader({obj!r}) (it follows the directory) as the source")
    if isinstance(obj, Iterable):
        return IterableSource(obj)
    raise TypeError(f"not a group source: {type(obj).__name__} (needs next_groups(k, timeout) or to be iterable)")


def iter_groups(source: Any, *, batch: int = 1, timeout: float | None = None) -> Iterator[Group]:
    """Every group of ``source`` until it is exhausted (or one call returns nothing
    within ``timeout``)."""
    src = as_group_source(source)
    while True:
        got = src.next_groups(batch, timeout=timeout)
        if not got:
            return
        yield from got
