"""A procedural family of tool environments: a seeded generator of `ToolTask`s.

The same contract as terminal families (tasks/envs/families/base.py): (family, level, seed) gives the
same environment byte for byte; the oracle call sequence passes the end-state checks and doing
nothing fails them; the checks carry their expected values, so the end state of seed A fails the
checks of seed B; instructions state the goal (implicit intents), never the call sequence.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from typing import ClassVar

from ....schemas.environment import EnvSpec
from ..families.base import Draft, Family
from .spec import ToolTask, compiled_fields


class ToolFamily(Family):
    kind: ClassVar[str] = "tools"
    # the oracle names this instance's records (ids, names): it does not solve a sibling
    replay_invariant: ClassVar[bool] = False

    @abstractmethod
    def task(self, level: int, rng: random.Random) -> ToolTask:
        """Generate one tool environment of `level` from `rng` (the only source of randomness)."""

    def draft(self, level: int, rng: random.Random) -> Draft:  # pragma: no cover - tool families compile tasks
        raise NotImplementedError("tool families generate ToolTasks (see `task`)")

    def generate(self, level: int, seed: int) -> EnvSpec:
        if level not in self.levels:
            raise ValueError(f"family {self.name!r} has levels {list(self.levels)}, not {level}")
        return self.env(level, seed, **compiled_fields(self.task(level, random.Random(f"{self.name}:{level}:{seed}"))))
