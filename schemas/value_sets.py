"""Value sets the expectation suites refer to instead of copying them, so a schema change cannot
silently break (or loosen) a gate.

In a suite, an expectation's `value_set` may be `{"$field": "Record.field"}` (the values of a
`Literal` field of a record type below) or `{"$set": "NAME"}` (a named set below). Unknown names,
and fields that are not a `Literal`, are errors naming the reference.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from .calibration import Calibration
from .common import INFRA_STATUSES, Status
from .environment import EnvSpec
from .export import PreferenceRow, RLRow, TrajectoryRow
from .trajectory import Rollout
from .verdict import Verdict

RECORDS: dict[str, type[BaseModel]] = {m.__name__: m for m in (Calibration, EnvSpec, PreferenceRow, RLRow,
                                                                  Rollout, TrajectoryRow, Verdict)}
# The model's own outcomes: what a dataset row may carry (infrastructure failures are never final).
MODEL_STATUSES: tuple[str, ...] = tuple(s for s in get_args(Status) if s not in INFRA_STATUSES)
NAMED: dict[str, tuple[Any, ...]] = {"MODEL_STATUSES": MODEL_STATUSES, "STATUSES": get_args(Status)}


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    """The values of a Literal annotation (also inside Optional); None if it is not one."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        values = [v for a in get_args(annotation) if a is not type(None) for v in (literal_values(a) or ())]
        return tuple(values) or None
    return None


def field_values(ref: str) -> list[Any]:
    record, _, field = ref.partition(".")
    model = RECORDS.get(record)
    if model is None or field not in model.model_fields:
        raise KeyError(f"value set {{'$field': {ref!r}}}: no such record field "
                       f"(records: {', '.join(sorted(RECORDS))})")
    hints = typing.get_type_hints(model)
    values = literal_values(hints[field])
    if values is None:
        raise KeyError(f"value set {{'$field': {ref!r}}}: the field is not a Literal")
    return list(values)


def resolve(value_set: Any) -> Any:
    """A suite's `value_set` with references replaced by their values (lists pass through)."""
    if isinstance(value_set, dict):
        if "$field" in value_set:
            return field_values(value_set["$field"])
        if "$set" in value_set:
            if value_set["$set"] not in NAMED:
                raise KeyError(f"value set {value_set!r}: unknown name (known: {', '.join(sorted(NAMED))})")
            return list(NAMED[value_set["$set"]])
    return value_set
