"""Small records shared by several stages."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# The failure taxonomy (docs/teachers.md). The first six are the model's outcome on the task (`agent_killed_sandbox`:
# its own command stopped its container, e.g. `pkill sleep` as root; its files are judged, never a pass); the last
# three are not the model's: retried, never counted as the teacher failing, excluded from difficulty stats
# (`harness_unavailable`: the environment's image lacks what the episode's harness needs, e.g. tmux; no turn ran).
Status = Literal["ok", "max_turns", "agent_timeout", "context_overflow", "format_error", "agent_killed_sandbox",
                 "infra_error", "teacher_error", "harness_unavailable"]
INFRA_STATUSES: frozenset[str] = frozenset({"infra_error", "teacher_error", "harness_unavailable"})


class JsonMark:
    """Marks a `str` field as JSON text: Arrow's JSON extension type in Parquet, which `datasets` reads as
    its `Json()` feature (the value comes back decoded: a dict, a list...)."""


class Measured:
    """Marks a field as a measurement of how the work went (a duration, a time, which endpoint answered),
    not of what it made: it is left out of a stage output's content digest (`tasks/engine/digest.py`), so a
    re-run that made the same rows in another time still lets what reads them be reused."""


class TarMark:
    """Marks a `bytes` field as a tar archive: its content digest covers each member's name, type, mode,
    owner, link target and bytes, never its mtime (the same files written at another time are the same)."""


Seconds = Annotated[float, Measured]


def _json_text(value: str) -> str:
    try:
        json.loads(value)
    except ValueError as err:
        raise ValueError(f"not JSON text: {err}") from None
    return value


JsonText = Annotated[str, AfterValidator(_json_text), JsonMark]


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


class PathChange(Record):
    """One change of the reference solution's change set: what kind, and (for a path that can change how the tests
    run, `changes.sensitive_class`) what the path holds afterwards: `f:<sha256>` (a file), `l:<target>` (a link),
    `d` (a folder), another type's letter; None where it was not read (an older record, or too large). For a
    configuration file (`judge.directives.format_of`), `directives`: the keys it sets, as that format's own parser
    reads them (an episode's file there with other keys has unexpected parts); None where not read."""

    path: str
    kind: Literal["added", "modified", "deleted"]
    content: str | None = None
    directives: list[str] | None = None


class ChangeSet(Record):
    """What an episode changed in its container, against its image (Docker's own diff of the container
    filesystem, taken after every agent process was killed and before any test ran). Paths are
    absolute; only the deepest changed paths are listed (a changed file, not every folder above it);
    /proc, /sys, /dev and the harness's own spool files are left out. Each list holds at most `cap` paths;
    `total` counts them all (a larger change set is truncated with its count, never an error). A
    rollout's change set is what verification decides on: it keeps up to 20,000 paths a list, and a
    truncated one never yields a pass; a verdict's copy is for display (`display`)."""

    added: list[str] = Field(default_factory=list)
    modified: list[str] = Field(default_factory=list)
    deleted: list[str] = Field(default_factory=list)
    total: int = 0
    truncated: bool = False

    def paths(self) -> list[str]:
        return [*self.added, *self.modified, *self.deleted]

    def display(self, cap: int = 200) -> "ChangeSet":
        """A copy with at most `cap` paths a list (`total` kept; `truncated` when anything was cut)."""
        lists = (self.added, self.modified, self.deleted)
        return ChangeSet(added=self.added[:cap], modified=self.modified[:cap], deleted=self.deleted[:cap],
                         total=self.total, truncated=self.truncated or any(len(x) > cap for x in lists))
