"""Per-environment, per-teacher difficulty from the solve rate."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from .common import Record

# Each label's meaning is stated once, in LABEL_DEFINITIONS (the dataset card prints it).
Label = Literal["trivial", "easy", "medium", "hard", "unsolved", "unverified", "unlabelled"]

# What each label says of the teacher's true solve rate p (placeholders: the `calibrate` config section;
# `trajforge.tasks.difficulty.bands.label_definitions(cfg)` fills them in). A row's `label` is the band of its
# point estimate passes/attempts; `certain` says how sure that is (CERTAINTY_DEFINITION).
LABEL_DEFINITIONS: dict[str, str] = {
    "trivial": "p >= {trivial}: the teacher fails at most {fail_rate} of attempts (symmetric to `unsolved` "
               "by default)",
    "easy": "{easy} <= p < {trivial}",
    "medium": "{medium} <= p < {easy}",
    "hard": "{unsolved_below} <= p < {medium}",
    "unsolved": "p < {unsolved_below}: solved too rarely to matter; not a claim that p is 0, which no finite "
                "number of attempts can show",
    "unverified": "no attempt of any teacher passed and the environment has no reference solution "
                  "(oracle absent): it may be unsolvable, so it is never called `unsolved`; a first pass makes "
                  "it proven solvable and gives it a band label",
    "unlabelled": "no attempt was counted (every episode an infrastructure outcome): nothing is known",
}
CERTAINTY_DEFINITION = (
    "`label_confidence` is the posterior probability that p lies in the label's band, under a prior over "
    "solve rates fitted to all of the teacher's environments in the build (nonparametric empirical Bayes); "
    "`certain` means label_confidence >= {confidence} (never for `unverified` / `unlabelled`). So 0 passes of "
    "n is a certain `unsolved` once the posterior puts {confidence} on p < {unsolved_below}. `ci_low` / "
    "`ci_high` are the Wilson score interval at the same confidence.")
POOLED_DEFINITION = (
    "`pooled_*`: one difficulty per environment across teachers. A joint fit (EM) of a per-teacher ability "
    "(logit shift) and a per-environment solve rate on the reference teacher's scale (`pooled_teacher`: "
    "`calibrate.pooled_reference`, by default the strongest teacher), with an empirical-Bayes prior over "
    "that rate. `pooled_solve_rate` is the maximum-likelihood rate of the reference teacher given every "
    "teacher's attempts (one teacher: passes/attempts); `pooled_label` is its band (same definitions), "
    "`pooled_confidence` the posterior mass on that band.")


class Calibration(Record):
    """`attempts` excludes infrastructure/teacher errors (counted in `excluded`); `attempts == 0`
    if and only if `label == "unlabelled"` (then `certain` is False and the interval is (0, 1)).
    The `pooled_*` columns are the environment's (equal on every row of one environment)."""

    env_id: str
    family: str
    level: int
    teacher: str
    attempts: int
    passes: int
    excluded: int
    harness: str | None = Field(None, description=(
        "the harness of the episodes counted when it is not the environment kind's own (`rollout.harnesses`); None: "
        "the kind's own. A pair is (environment, teacher, harness)"))
    solve_rate: float
    ci_low: float
    ci_high: float
    label: Label
    certain: bool = Field(description="label_confidence >= calibrate.confidence (CERTAINTY_DEFINITION)")
    hacks: int = Field(0, description="verified rollouts flagged as hacks (never counted as passes)")
    label_confidence: float = Field(0.0, description="posterior probability that the rate lies in the label's band")
    pooled_label: Label = Field("unlabelled", description="the environment's difficulty across teachers")
    pooled_solve_rate: float = Field(0.0, description="the reference teacher's rate, fitted from all teachers")
    pooled_confidence: float = Field(0.0, description="posterior mass on the pooled label's band")
    pooled_teacher: str = Field("", description="the teacher whose scale the pooled rate is on (`teacher · harness` "
                                                "under a harness that is not the kind's own)")


class RoundPlan(BaseModel):
    """What `calibrate` asks of the next adaptive round (kept in its manifest's stats as `round_plan`):
    for each environment whose label is not yet sure, how many more samples (`needs_more`), numbered
    from `next_sample`, of which teachers (`unsure_teachers`, by label). Empty: no more rounds."""

    model_config = ConfigDict(extra="forbid")

    needs_more: dict[str, int] = {}
    next_sample: dict[str, int] = {}
    unsure_teachers: dict[str, list[str]] = {}
    unsure_harnesses: dict[str, list[str | None]] = {}  # parallel to unsure_teachers (None: the kind's own harness)

    STATS_KEY: ClassVar[str] = "round_plan"

    @classmethod
    def of(cls, stats: dict) -> "RoundPlan":
        return cls.model_validate(stats.get(cls.STATS_KEY) or {})

    @property
    def episodes(self) -> int:
        return sum(self.needs_more.values())
