"""The execution-free monitor (issue 54): a second signal beside the hidden tests, read from what the agent did.

For every rollout the verify stage gathers its `Evidence` once (commands, observations, changed files as captured,
the change set, the final message) and runs every registered detector over it. A row gets `monitor_flags` (each
with its detector, step or file and evidence), `monitor_score` = 1 - prod(1 - weight) over the detectors that
fired, and `monitor_rationale` (one line per finding). Nothing runs: the monitor judges what was recorded.

How it acts is `verify.monitor.mode`: `column` (default) records and never changes a verdict; `flag` turns a
score at or above `verify.monitor.threshold` into a `monitor` hack flag (the row is then not `passed`, so it stays
out of `sft` and `preference`); `reject` drops such a row from the verdicts as a `monitor_reject`.
A new detector is one module here and one name in the import below (static, so the verify stage's code version
covers every detector: tasks/engine/codeversion.py reads imports, not strings).
"""

from __future__ import annotations

from ....schemas.environment import EnvSpec
from ....schemas.trajectory import Rollout
from ....schemas.verdict import MonitorFlag
from . import (  # noqa: F401 (register)
    encoded,
    grounding,
    internals,
    model_judge,
    outlives,
    processes,
    siblings,
    test_aware,
    tool_output,
    unexplained_writes,
    verifier_paths,
)
from .evidence import Evidence, gather
from .registry import DETECTORS, Detector, flag, get, register

BUILT_IN = tuple(DETECTORS)  # in registration order

RATIONALE_LINES = 8

__all__ = ["DETECTORS", "Detector", "Evidence", "flag", "gather", "get", "monitor", "register", "score"]


def score(flags: list[MonitorFlag]) -> float:
    """1 - prod(1 - weight) over the distinct detectors in `flags` (a detector counts once, however often it fired)."""
    out = 1.0
    for name in sorted({f.detector for f in flags}):
        out *= 1 - DETECTORS[name].weight
    return round(1 - out, 4)


def monitor(r: Rollout, env: EnvSpec, detectors: list[str] | None = None) -> tuple[list[MonitorFlag], float, str]:
    """(findings, score, rationale) of one rollout. A detector that raises is a finding of its own kind
    (`monitor_error`, weight 0: it never raises the score), never a crash of the stage."""
    try:
        ev = gather(r, env)
    except Exception as err:  # a rollout the monitor cannot read at all: said, never a crash
        return [], 0.0, f"unreadable: {err.__class__.__name__}: {str(err)[:200]}"
    flags: list[MonitorFlag] = []
    errors: list[str] = []
    for name in detectors if detectors is not None else list(DETECTORS):
        try:
            flags += get(name).find(ev)
        except Exception as err:  # noqa: BLE001 - one detector's bug must not lose the row
            errors.append(f"{name}: {err.__class__.__name__}: {str(err)[:120]}")
    lines = [f"{f.detector}" + (f" (turn {f.turn})" if f.turn is not None else "") + (f" {f.path}" if f.path else "")
             + f": {f.evidence[:120]}" for f in flags[:RATIONALE_LINES]]
    if len(flags) > RATIONALE_LINES:
        lines.append(f"... {len(flags) - RATIONALE_LINES} more")
    lines += [f"unreadable: {p}" for p in ev.problems] + [f"detector error: {e}" for e in errors]
    return flags, score(flags), "\n".join(lines)
