"""`build.json`: what a build ran, with which config and code, and each stage's outcome.

Written by the driver only (`flows.build`); read by `status`, `explain`, `publish` and resume.
Stage entries are keyed by stage instance (`verify`, or `verify.r2` in adaptive round 2).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StageEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fingerprint: str
    components: dict[str, Any]
    status: Literal["running", "reused", "committed", "failed", "stale"] = Field(description=(
        "`stale`: committed by an earlier run of this build, but a stage it reads now holds other rows (that "
        "stage was re-run alone with --only); it no longer counts as committed until it runs again"))
    manifest: str | None = None
    rows: int | None = None
    rejects: int | None = None
    reused_from: str | None = None
    error: str | None = None
    note: str | None = Field(None, description=(
        "why a committed output of the same fingerprint was not reused (its part files changed after its commit), "
        "or why the entry is `stale`"))
    gate: dict[str, Any] | None = Field(None, description=(
        "the gate's outcome beyond pass: `failures` (a failed gate: name, observed value, threshold, first "
        "offending rows), `accepted` (failures committed on purpose with --accept-gate), `overridden` "
        "(thresholds the config set, expectations it turned off with the reason), `regated` (only the gate ran "
        "again)"))


class BuildRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    build_id: str
    dataset: str
    created_at: str
    config: dict[str, Any] = {}
    config_hash: str = ""
    trajforge_version: str = ""
    status: Literal["running", "committed", "partial", "failed"] = "running"
    selected: list[str] = []
    forced: list[str] = []
    accept_gates: list[str] = Field(default_factory=list, description="`--accept-gate` names of the last run")
    stages: dict[str, StageEntry] = {}
    dataset_dir: str | None = None
    error: str | None = None
    finished_at: str | None = None

    def committed(self, stage: str) -> str | None:
        """The manifest folder of `stage` in this build when it was committed or reused, else None."""
        e = self.stages.get(stage)
        return e.manifest if e is not None and e.status in ("reused", "committed") else None
