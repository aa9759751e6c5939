"""Harnesses side by side (issue 44): one row per (teacher, harness) of what its episodes did.

The dataset card (from the exported `trajectories` rows) and the build report (from the committed rollouts and
verdicts) both compare harnesses with this one accumulator, so the two say the same for the same rows.

Invariants: `solve rate` = passed / judged, where judged excludes infrastructure outcomes (`INFRA_STATUSES`: an
episode the machine lost says nothing of the harness); turns and completion tokens are means over every episode of
the pair; `act/verify` is the mean `act_verify_share` quality signal over the episodes that have it (None: none has).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...schemas.common import INFRA_STATUSES

HEADER = ["teacher", "harness", "episodes", "solve rate", "mean turns", "mean completion tokens", "act/verify share",
          "hack-flagged"]


@dataclass
class _Pair:
    episodes: int = 0
    judged: int = 0
    passed: int = 0
    turns: int = 0
    tokens: int = 0
    flagged: int = 0
    av: list[float] = field(default_factory=list)


class HarnessComparison:
    """Add episodes with `add`, read the table with `rows`; `harnesses` says how many harnesses were seen."""

    def __init__(self) -> None:
        self._pairs: dict[tuple[str, str], _Pair] = {}

    def add(self, teacher: str, harness: str | None, *, passed: bool, status: str, turns: int,
            completion_tokens: int, flagged: bool, act_verify_share: float | None = None) -> None:
        p = self._pairs.setdefault((teacher, harness or "?"), _Pair())
        p.episodes += 1
        p.judged += status not in INFRA_STATUSES
        p.passed += bool(passed)
        p.turns += int(turns or 0)
        p.tokens += int(completion_tokens or 0)
        p.flagged += bool(flagged)
        if act_verify_share is not None:
            p.av.append(float(act_verify_share))

    @property
    def harnesses(self) -> set[str]:
        return {h for _, h in self._pairs}

    def rows(self) -> list[list[Any]]:
        """HEADER's columns, one row per (teacher, harness), sorted by teacher then harness."""
        out = []
        for (teacher, harness), p in sorted(self._pairs.items()):
            out.append([teacher, harness, p.episodes,
                        round(p.passed / p.judged, 3) if p.judged else None,
                        round(p.turns / p.episodes, 2), round(p.tokens / p.episodes, 1),
                        round(sum(p.av) / len(p.av), 3) if p.av else None, p.flagged])
        return out
