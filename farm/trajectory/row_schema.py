"""Arrow schemas derived from pydantic row models: a table's columns are declared once, by
the model of its row (``Sample``, ``RolloutRow``, ``TranscriptRow``), and its schema is read
off the model's fields in their declaration order.

A field's Arrow type is its Python type's default (str -> string, int -> int64, float ->
float64, bool -> bool_) unless an ``Arrow`` annotation names one (``Annotated[int,
Arrow(pa.int32())]``), with the column's doc as the field's Arrow metadata. Kept here, below
both tables' packages (the Samples' ``farm.trajectory`` and the output directory's
``farm.output``), so each derives its schema the same way.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel


@dataclass(frozen=True)
class Arrow:
    """A column's Arrow type, when not the default of its Python type (str -> string,
    int -> int64, float -> float64, bool -> bool_), and its doc (the field's metadata);
    ``nullable``: whether it takes nulls, where its Python type cannot say (``Any``)."""

    type: pa.DataType | None = None
    doc: str = ""
    nullable: bool | None = None


_DEFAULT_TYPES = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def takes_none(annotation: object) -> bool:
    """Whether a field of this annotation takes None (``X | None``, ``Optional[X]``)."""
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def arrow_schema(model: type[BaseModel], *, strict_nulls: bool = False,
                 metadata: dict[bytes, bytes] | None = None) -> pa.Schema:  # fmt: skip
    """The Arrow schema of a row model: one column per field, in declaration order, with
    ``metadata`` as the schema's. ``strict_nulls``: a column takes nulls only where its field
    takes None (else every column does, as the rollouts and transcripts tables always have)."""
    fields = []
    for name, info in model.model_fields.items():
        arrow = next((m for m in info.metadata if isinstance(m, Arrow)), Arrow())
        if arrow.type is not None:
            typ = arrow.type
        else:
            typ = _DEFAULT_TYPES[next(a for a in (get_args(info.annotation) or (info.annotation,))
                                      if a is not type(None))]  # fmt: skip
        nullable = arrow.nullable if arrow.nullable is not None else (takes_none(info.annotation) or not strict_nulls)
        fields.append(pa.field(name, typ, nullable=nullable, metadata={"doc": arrow.doc} if arrow.doc else None))
    return pa.schema(fields, metadata=metadata)
