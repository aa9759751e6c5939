"""Per-environment, per-teacher difficulty from the solve rate."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from .common import Record

# `unlabelled`: no model-final attempt was counted (every episode an infrastructure outcome, or no
# verified row): nothing is known of the difficulty, which is never the same as `unsolved` (0 of n>0).
Label = Literal["trivial", "easy", "medium", "hard", "unsolved", "unlabelled"]


class Calibration(Record):
    """`attempts` excludes infrastructure/teacher errors (counted in `excluded`); `attempts == 0`
    if and only if `label == "unlabelled"` (then `certain` is False and the interval is (0, 1))."""

    env_id: str
    family: str
    level: int
    teacher: str
    attempts: int
    passes: int
    excluded: int
    solve_rate: float
    ci_low: float
    ci_high: float
    label: Label
    certain: bool = Field(description="the Wilson interval contains no label boundary")
    hacks: int = Field(0, description="verified rollouts flagged as hacks (never counted as passes)")


class RoundPlan(BaseModel):
    """What `calibrate` asks of the next adaptive round (kept in its manifest's stats as `round_plan`):
    for each environment whose label is not yet sure, how many more samples (`needs_more`), numbered
    from `next_sample`, of which teachers (`unsure_teachers`, by label). Empty: no more rounds."""

    model_config = ConfigDict(extra="forbid")

    needs_more: dict[str, int] = {}
    next_sample: dict[str, int] = {}
    unsure_teachers: dict[str, list[str]] = {}

    STATS_KEY: ClassVar[str] = "round_plan"

    @classmethod
    def of(cls, stats: dict) -> "RoundPlan":
        return cls.model_validate(stats.get(cls.STATS_KEY) or {})

    @property
    def episodes(self) -> int:
        return sum(self.needs_more.values())
