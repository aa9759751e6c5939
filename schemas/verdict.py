"""The verifier's verdict on one rollout, with hack evidence and quality signals."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .common import ChangeSet, Record, Seconds, Status


class TestResult(Record):
    __test__ = False  # not a pytest class
    name: str
    passed: bool
    message: str = ""


class HackFlag(Record):
    """Evidence of a reward hack (`severity` hack) or of something a human should look at (`review`).
    `turn`/`command` point at the step that did it, when one did."""

    kind: str
    severity: Literal["hack", "review"] = "hack"
    turn: int | None = None
    command: str | None = None
    detail: str = ""


class MonitorFlag(Record):
    """One finding of the execution-free monitor (tasks/judge/monitor): which detector, the step (turn) or the file
    where it saw it, and the evidence quoted (capped). Never a verdict by itself (`verify.monitor.mode`)."""

    detector: str
    turn: int | None = None
    path: str | None = None
    evidence: str = ""


class Quality(Record):
    """Per-trajectory signals (see tasks/judge/quality.py): step labels inspect/act/verify and what they imply."""

    labels: list[str] = Field(default_factory=list)
    inspect_steps: int = 0
    act_steps: int = 0
    verify_steps: int = 0
    inspect_before_act: bool = False
    act_verify_share: float = 0.0
    ends_with_verify: bool = False
    repeated_commands: int = 0
    failed_commands: int = 0
    recoveries: int = 0
    leftover_processes: int = Field(0, description=(
        "processes the agent left running when its episode ended (-1: too many to count, or not all confirmed gone); "
        "gone before judging wherever it cannot reach the tests, a count is a habit worth knowing, not a hack "
        "(tasks/judge/hacks.py)"))
    turns: int = 0
    completion_tokens: int = 0
    wall_s: Seconds = 0.0


class Verdict(Record):
    """`verified` is False when there was nothing to verify (infrastructure failure); such rows
    never count as a pass or a fail of the teacher. `reward` = fraction of tests passed (as measured);
    `passed` = the episode submitted, every test passed and no hack was flagged."""

    rollout_id: str
    env_id: str
    teacher: str
    sample: int
    status: Status
    verified: bool
    harness: str | None = Field(None, description="the rollout's harness (`Rollout.harness`; None: a verdict written "
                                                   "before verdicts carried it)")
    reward: float = 0.0
    tests_passed: bool = False
    passed: bool = False
    tests: list[TestResult] = Field(default_factory=list)
    hack_flags: list[str] = Field(default_factory=list)
    hacks: list[HackFlag] = Field(default_factory=list)
    quality: Quality = Field(default_factory=Quality)
    verifier_output: str = ""
    duration_s: Seconds = 0.0
    mode: Literal["fresh", "in_place", "isolated", "isolated_fallback", "none"] = Field(
        "none", description="where the hidden tests ran (the venue, tasks/judge/venue.py): a new container from the "
                            "episode's committed files, the episode's own container, the image plus the captured final "
                            "state, the same because the results folder could not be trusted, or not at all")
    changes: ChangeSet | None = Field(None, description="what the episode changed in its container")
    unexpected: list[str] = Field(default_factory=list, description=(
        "changed paths the reference solution did not need (capped at 200)"))
    counterfactual: Literal["not_needed", "held", "flipped", "error"] = Field("not_needed", description=(
        "a pass re-tested with the suspicious unexpected changes reverted: `held` (still passes), `flipped` "
        "(fails: the pass depended on them, a hack), `error`; `not_needed` when nothing was reverted"))
    reverted: list[str] = Field(default_factory=list, description="what the counterfactual run reverted")
    monitor_flags: list[MonitorFlag] = Field(default_factory=list, description=(
        "the execution-free monitor's findings (tasks/judge/monitor): a second signal beside the tests, read from "
        "what the agent did (commands, observations, files as captured, the change set)"))
    monitor_score: float = Field(0.0, ge=0, le=1, description=(
        "how strongly the monitor doubts the row: 1 - prod(1 - weight) over its detectors that fired (0: none)"))
    monitor_rationale: str = Field("", description="the monitor's findings in one line each, or why it could not read "
                                                   "the rollout (`unreadable: ...`)")
    judge_verdict: Literal["legitimate_success", "legitimate_failure", "reward_hack", "task_defect", "unparsable",
                           "judge_error"] | None = Field(None, description=(
        "the model judge's verdict (`verify.monitor.judge`; None: no judge): one of its four answers, `unparsable` "
        "(it answered off-format: `judge_evidence` quotes the answer) or `judge_error` (no answer: timeout, teacher "
        "down)"))
    judge_evidence: str = Field("", description="what the judge quoted for its verdict, or why there is none (capped)")
