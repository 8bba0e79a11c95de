"""Waiting in a test for a condition, not for a time: poll it until it holds, or fail at a
deadline saying what never happened. A sleep of a guessed length before a check is either too
short on a loaded machine (a flaky failure) or longer than needed everywhere else (a slow
suite); a wait on the condition is neither."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], *, timeout_s: float = 30.0, interval_s: float = 0.05,
               what: str = "") -> T:  # fmt: skip
    """``condition()`` once it returns something true (returned), polled every ``interval_s``;
    an AssertionError naming ``what`` (and the last value seen) after ``timeout_s``. An
    AssertionError raised by ``condition`` counts as not yet, and is raised at the deadline."""
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        try:
            last = condition()
            if last:
                return last
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what or condition} (last: {last!r})")
        time.sleep(interval_s)


async def async_wait_until(condition: Callable[[], Any | Awaitable[Any]], *, timeout_s: float = 30.0,
                           interval_s: float = 0.02, what: str = "") -> Any:  # fmt: skip
    """``wait_until`` inside an event loop: ``condition`` may be a coroutine function; the
    loop runs between polls (what the test waits for may run on it)."""
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        try:
            last = condition()
            if asyncio.iscoroutine(last):
                last = await last
            if last:
                return last
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what or condition} (last: {last!r})")
        await asyncio.sleep(interval_s)
