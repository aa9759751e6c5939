"""Arrow schemas derived from the pydantic records (the records are the single source of truth).

Invariant: every record type that is written to Parquet maps to exactly one Arrow schema, computed
here from its field annotations; nothing else in the code base spells an Arrow type by hand.
Supported field types: str, int, float, bool, bytes, datetime, Literal[str...], Enum, nested
BaseModel (struct), list[...] (list), Optional[...] (nullable). Free-form dicts are rejected on
purpose: a field that needs one stores JSON text under a name ending in `_json`.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import types
import typing
from typing import Any, Iterable, TypeVar

import pyarrow as pa
from pydantic import BaseModel

from .common import JsonMark

M = TypeVar("M", bound=BaseModel)

_SCALARS: dict[Any, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    bytes: pa.large_binary(),
    dt.datetime: pa.timestamp("us", tz="UTC"),
}


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated and not _is_json(tp):  # (a validator only: its base type decides)
        return _unwrap_optional(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
        raise TypeError(f"union {tp} has no Arrow mapping; use one type or Optional[...]")
    return tp, False


def _is_json(tp: Any) -> bool:
    return typing.get_origin(tp) is typing.Annotated and JsonMark in typing.get_args(tp)[1:]


def arrow_type(tp: Any, where: str = "?") -> pa.DataType:
    """The Arrow type of one annotation; raises TypeError naming the field for unsupported ones."""
    tp, _ = _unwrap_optional(tp)
    if _is_json(tp):
        return pa.json_()
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        values = typing.get_args(tp)
        if all(isinstance(v, str) for v in values):
            return pa.string()
        if all(isinstance(v, int) for v in values):
            return pa.int64()
    if origin in (list, tuple) or tp in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) != 1:
            raise TypeError(f"{where}: list fields need one item type, got {tp}")
        return pa.list_(arrow_type(args[0], where + "[]"))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return pa.string()
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return pa.struct(_fields(tp))
    raise TypeError(f"{where}: type {tp!r} has no Arrow mapping (store JSON text in a `*_json` field)")


def _fields(model: type[BaseModel]) -> list[pa.Field]:
    fields = []
    for name, info in model.model_fields.items():
        _, optional = _unwrap_optional(info.annotation)
        tp = pa.json_() if JsonMark in info.metadata else arrow_type(info.annotation, f"{model.__name__}.{name}")
        fields.append(pa.field(name, tp, nullable=optional))  # (pydantic keeps a field's own Annotated in metadata)
    return fields


@functools.cache
def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """The explicit Arrow schema of a record type (cached; records are immutable classes)."""
    return pa.schema(_fields(model), metadata={b"trajforge.record": model.__name__.encode()})


def to_table(model: type[M], rows: Iterable[M] | pa.Table) -> pa.Table:
    """Records -> Arrow table with the derived schema (validates every row against it).

    A stage that builds its output column by column (export: messages stay Arrow, never become
    pydantic objects) passes a table: it is conformed to the schema (its columns in schema order,
    cast; a missing column or an impossible cast raises, naming the column)."""
    schema = arrow_schema(model)
    if isinstance(rows, pa.Table):
        missing = [n for n in schema.names if n not in rows.column_names]
        if missing:
            raise ValueError(f"{model.__name__} table lacks column(s) {missing}")
        return rows.select(schema.names).cast(schema)
    rows = pa.Table.from_pylist([r.model_dump(mode="python") for r in rows], schema=storage_schema(schema))
    return rows.cast(schema)


def storage_type(t: pa.DataType) -> pa.DataType:
    """`t` with every JSON extension type replaced by its storage (text): what Python values convert to
    (pyarrow builds no extension array from a list of values; a cast then gives the extension back)."""
    if isinstance(t, pa.JsonType):
        return t.storage_type
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, storage_type(t.value_type), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, storage_type(f.type), f.nullable) for f in t])
    return t


def as_storage(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One array of `arr`'s values with JSON typed as its text: what kernels, builders and `combine_chunks`
    take (none of them builds a JSON extension child, even for zero chunks)."""
    arr = arr.cast(storage_type(arr.type))
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table with no rows of `schema` (`Schema.empty_table` cannot build JSON extension columns)."""
    return storage_schema(schema).empty_table().cast(schema)


def storage_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, storage_type(f.type), f.nullable) for f in schema], metadata=schema.metadata)


def from_table(model: type[M], table: pa.Table) -> list[M]:
    """Arrow table -> records; pydantic re-validates each row. A null in a column whose field has a
    non-null default takes that default: Parquet written before the field existed reads back (the
    reader fills a missing column with nulls)."""
    defaulted = [n for n, f in model.model_fields.items()
                 if not f.is_required() and f.get_default(call_default_factory=True) is not None]
    rows = table.to_pylist()
    for row in rows:
        for n in defaulted:
            if n in row and row[n] is None:
                del row[n]
    return [model.model_validate(row) for row in rows]
