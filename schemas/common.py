"""Small records shared by several stages."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

# The failure taxonomy (README, "Teachers"). The first five are the model's outcome on the task; the last two
# are infrastructure: retried, never counted as the teacher failing, excluded from difficulty stats.
Status = Literal["ok", "max_turns", "agent_timeout", "context_overflow", "format_error",
                 "infra_error", "teacher_error"]
INFRA_STATUSES: frozenset[str] = frozenset({"infra_error", "teacher_error"})


class Record(BaseModel):
    """Base of every row record: unknown fields are an error, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


class Reject(Record):
    """A row a stage refused, with a stable reason code (filterable) and a human detail."""

    key: str
    reason: str
    detail: str = ""


class FileSpec(Record):
    """A file placed somewhere by the pipeline. `path` is relative to the place it is put."""

    path: str
    content: str
    mode: int = 0o644
