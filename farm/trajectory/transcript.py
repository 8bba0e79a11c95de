"""A session's canonical transcript: the messages of its main line so far.

The gateway records every turn with the canonical messages it added and the assistant
message it returned (``TurnRecord.messages`` / ``response``), whatever the CLI's wire
protocol; the main line is the history of the latest trainable turn (tool calls and
their results included). ``farm.single`` serves it as a rollout's ``messages()``.
"""

from __future__ import annotations

from typing import Any


def transcript(tree: Any) -> list[dict[str, Any]]:
    """The main line's messages (``[]`` for no tree or an empty one)."""
    if tree is None or not len(tree):
        return []
    main = [t for t in tree.turns if t.trainable] or list(tree.turns)
    last = max(main, key=lambda t: t.created_at)
    return tree.history(last.turn_id)
