"""Procedural environment families: a seeded generator of (instruction, files, tests, solution).

Invariants every family keeps (checked in Docker by the synthesize stage and the tests):
- the same (family, level, seed) gives the same environment, byte for byte;
- the reference solution *computes* the answer from the files (never a hard-coded literal), and
  passes the hidden tests; doing nothing fails them;
- hidden tests are Python `test_*` functions run by the verifier runner as root after the episode;
  they read the agent's work dir from the `WORK` global (and run agent-written code only through
  `run_as_agent`), and carry their expected values, so the answer of seed A fails the tests of seed B;
- instructions state the goal, not the steps.
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from ....schemas.common import FileSpec
from ....schemas.environment import EnvSpec


@dataclass
class Draft:
    instruction: str
    files: list[FileSpec]
    tests: str
    solution: list[str]
    knobs: dict = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)  # build-time commands (run as the agent in the work dir)
    protected: list[str] = field(default_factory=list)  # inputs the tests read: tampering is a hack


class Family(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    kind: ClassVar[str] = "terminal"  # the EnvSpec kind it generates (`tools`: tool_base.py)
    levels: ClassVar[tuple[int, ...]] = (1, 2, 3)
    # The reference solution reads everything instance-specific from the work dir, so the same commands
    # solve any instance: replaying a success on a sibling then tells a computed answer from a written
    # one. False where the fix itself is instance-specific (a patch, a query with the question's literals).
    replay_invariant: ClassVar[bool] = True

    @abstractmethod
    def draft(self, level: int, rng: random.Random) -> Draft:
        """Generate one environment of `level` from `rng` (the only source of randomness)."""

    def sibling(self, env: EnvSpec) -> EnvSpec:
        """Another instance of the same family and level (for the instance-specificity check)."""
        return self.generate(env.level, env.seed + 7919)

    def generate(self, level: int, seed: int) -> EnvSpec:
        if level not in self.levels:
            raise ValueError(f"family {self.name!r} has levels {list(self.levels)}, not {level}")
        rng = random.Random(f"{self.name}:{level}:{seed}")
        d = self.draft(level, rng)
        return self.env(level, seed, instruction=d.instruction.strip(), files=d.files, setup=d.setup,
                        protected=d.protected, tests=[FileSpec(path="test_task.py", content=d.tests)],
                        solution=d.solution, knobs_json=json.dumps(d.knobs, sort_keys=True))

    def env(self, level: int, seed: int, **fields) -> EnvSpec:
        """The environment of (level, seed) with `fields`; its id ends with its content hash."""
        env = EnvSpec(env_id="pending", family=self.name, level=level, seed=seed, source=f"procedural:{self.name}",
                      **fields)
        env.env_id = f"{self.name}-l{level}-s{seed}-{env.content_hash()[:8]}"
        return env


def tests_module(expected: dict, body: str) -> str:
    """A hidden-test file: `EXPECTED` embedded as JSON, then the test functions."""
    return ("import json, os, pathlib\n"
            "W = pathlib.Path(globals().get('WORK') or os.environ.get('WORK', '/home/agent/work'))\n"
            f"EXPECTED = json.loads({json.dumps(json.dumps(expected, sort_keys=True))})\n\n{body.strip()}\n")


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]
