"""``Sample``'s validation, a whole Arrow table at a time.

Reading Samples back (``table_to_samples``: a trainer's ``GroupReader``, the torch
dataset, ``farm inspect``) used to validate each row by constructing a ``Sample``: a
pydantic model per row and a handful of numpy calls on arrays of a few hundred
elements, whose fixed cost is most of the work on short rows (a trainer following a
continuous stream spent a quarter of its process's CPU there). Every check is a
column-wise one instead: the columns' types are the schema's, no null where the model
takes none, the integer columns within the model's own bounds (read from its fields, so
a new bound is checked here too), each row's lengths consistent, ``loss_mask`` 0/1,
``rollout_logprobs`` finite and 0.0 where untrained. When all hold, every row would pass
``Sample``'s validation and is built without it; when one does not, the caller validates
row by row and raises exactly what ``Sample`` raises.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from annotated_types import Ge, Le
from pydantic import BaseModel

from farm.trajectory.row_schema import takes_none

# a list column's (offsets, values) by name. Its values must already have the model's
# dtype (``dtypes``): a null inside makes pyarrow hand back another one, and those rows then
# go through the model's own conversion.
ListColumns = dict[str, tuple[np.ndarray, np.ndarray]]


def scalar_rules(model: type[BaseModel], names: list[str]) -> dict[str, tuple[bool, Any, Any]]:
    """name -> (None allowed, lower bound or None, upper bound or None), from ``model``'s fields."""
    rules = {}
    for name in names:
        field = model.model_fields[name]
        nullable = takes_none(field.annotation)
        lo = next((m.ge for m in field.metadata if isinstance(m, Ge)), None)
        hi = next((m.le for m in field.metadata if isinstance(m, Le)), None)
        rules[name] = (nullable, lo, hi)
    return rules


def table_passes(table: pa.Table, schema: pa.Schema, rules: dict[str, tuple[bool, Any, Any]],
                 lists: ListColumns, dtypes: dict[str, type]) -> bool:  # fmt: skip
    """True when every row of ``table`` (``schema``'s columns, one chunk each) holds what
    ``Sample`` checks on construction (see the module doc). False: some row may not."""
    if table.num_rows == 0:
        return True
    for name, (nullable, lo, hi) in rules.items():
        col = table.column(name)
        if not col.type.equals(schema.field(name).type):
            return False
        if col.null_count and not nullable:
            return False
        if (lo is not None or hi is not None) and col.null_count < len(col):
            bounds = pc.min_max(col)
            if (lo is not None and bounds["min"].as_py() < lo) or (hi is not None and bounds["max"].as_py() > hi):
                return False
    if any(lists[n][1].dtype != np.dtype(d) for n, d in dtypes.items()):
        return False
    length = {name: np.diff(offs) for name, (offs, _) in lists.items()}
    prompt = table.column("prompt_length").to_numpy()
    response = table.column("response_length").to_numpy()
    if not (np.array_equal(length["tokens"], prompt.astype(np.int64) + response)
            and np.array_equal(length["loss_mask"], response) and np.array_equal(length["rollout_logprobs"], response)):
        return False
    mask = _referenced(*lists["loss_mask"])
    logprobs = _referenced(*lists["rollout_logprobs"])
    if len(mask) and int(mask.max()) > 1:
        return False
    # row by row these are each row's own arrays; with the lengths equal row for row, the
    # referenced ranges of the two columns line up element for element
    if len(logprobs) and not np.isfinite(logprobs.sum(dtype=np.float64)):
        return False
    return not nonzero_where_untrained(mask, logprobs)


def _referenced(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The values the rows refer to (a sliced list array's child holds more)."""
    return values[offsets[0] : offsets[-1]]


def nonzero_where_untrained(mask: np.ndarray, logprobs: np.ndarray, chunk: int = 1 << 16) -> bool:
    """Any logprob != 0 under loss_mask 0? (``Sample``'s own check, and this module's over a
    whole table.) Chunked so temporaries stay small (no fresh multi-MB allocations per
    Sample: page faults dominate at 1M tokens)."""
    for i in range(0, len(mask), chunk):
        m, lp = mask[i : i + chunk], logprobs[i : i + chunk]
        if np.any(lp[m == 0]):
            return True
    return False
