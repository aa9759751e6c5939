"""LLM synthesis of environments (ClawEnvKit-style parser -> generator -> validator).

For each theme in `synthesize.llm.themes`, the configured teacher is asked for candidate environments
as one JSON object: a natural instruction (the goal, not the steps), the work files, hidden tests
(Python `test_*` functions that read the work dir from `W`), a reference solution that computes the
answer, and a difficulty level. The reply is parsed leniently (a ```json block or the first
balanced object), then validated strictly; a malformed candidate is a reject with its reason, never a
crash. Accepted candidates are ordinary environments (source `llm:<theme>`) and go through the same
validator as every other source.

Reject reasons: `teacher_error`, `llm_no_json`, `llm_bad_json`, `llm_schema` (names the fields),
`llm_unsafe_path`, `llm_unsafe_tests`. Tool environments from `synthesize.llm.tool_themes` are written
the same way (tools.py: the same reply parsing, `ask` and naming of reply.py, the safety check of safety.py).
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ....schemas.common import FileSpec, Reject
from ....schemas.config import safe_name
from ....schemas.environment import EnvSpec
from ....schemas.pysource import compile_code
from ..families.base import tests_module
from .reply import propose_with, synthesized, validated
from .safety import unsafe_tests

SYSTEM = ("You design self-contained command-line tasks for training terminal agents. Reply with exactly one JSON "
          "object and nothing else.")
PROMPT = """Theme: {theme}

Write one task as a JSON object with these fields:
- "instruction": what the user wants (the goal and the exact output format, not the steps), at least 20 characters;
- "files": a list of {{"path": relative path, "content": text}} placed in the agent's work directory;
- "tests": Python source defining functions named test_*; `W` is a pathlib.Path of the work directory, `json`,
  `os` and `pathlib` are imported; each test asserts one property of the finished work; the tests run as root:
  they may read files, and run the agent's programs only through `run_as_agent([...])` (it runs them as the
  unprivileged agent and returns a subprocess.CompletedProcess), never subprocess, os.system, exec or import;
- "solution": a list of shell commands, run in order in the work directory, that compute the answer from the
  files (never write a literal answer);
- "level": 1, 2 or 3 (difficulty).
Variant {index}. Example of the shape (a different theme):
{example}"""
EXAMPLE = {"instruction": "Write the number of lines of data.txt that contain the word ERROR to count.txt.",
           "files": [{"path": "data.txt", "content": "ok\nERROR x\nok\nERROR y\n"}],
           "tests": "def test_count():\n    assert (W / 'count.txt').read_text().strip() == '2'\n",
           "solution": ["grep -c ERROR data.txt > count.txt"], "level": 1}


class Candidate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    instruction: str = Field(min_length=20)
    files: list[FileSpec] = Field(default_factory=list, max_length=200)
    tests: str = Field(min_length=10)
    solution: list[str] = Field(min_length=1)
    level: int = Field(2, ge=1, le=3)

    @field_validator("tests")
    @classmethod
    def _has_tests(cls, v: str) -> str:
        if not re.search(r"^def test_\w+\(", v, re.M):
            raise ValueError("defines no test_* function")
        compile_code(v, "<tests>")
        return v


def parse_candidate(text: str, theme: str, index: int) -> tuple[EnvSpec | None, Reject | None]:
    """One terminal environment from a teacher's reply, or the reject saying why not (`llm_schema`,
    `llm_unsafe_path`, `llm_unsafe_tests`; the reply's own parse: reply.py)."""
    key = f"llm:{safe_name(theme)}:{index}"
    cand, reject = validated(text, key, Candidate)
    if reject:
        return None, reject
    for f in cand.files:
        if f.path.startswith("/") or ".." in f.path.split("/") or not f.path.strip():
            return None, Reject(key=key, reason="llm_unsafe_path", detail=f.path)
    problem = unsafe_tests(cand.tests)
    if problem:
        return None, Reject(key=key, reason="llm_unsafe_tests", detail=problem)
    return synthesized(theme, index, cand.level, instruction=cand.instruction.strip(), files=cand.files,
                       tests=[FileSpec(path="test_task.py", content=tests_module({}, cand.tests))],
                       solution=cand.solution, knobs_json=json.dumps({"theme": theme})), None


async def propose(teacher, theme: str, index: int) -> tuple[EnvSpec | None, Reject | None]:
    """Ask the teacher for one candidate; every failure is a reject."""
    return await propose_with(teacher, SYSTEM, PROMPT.format(theme=theme, index=index, example=json.dumps(EXAMPLE)),
                              index, f"llm-synthesis|{theme}|{index}", f"llm:{safe_name(theme)}:{index}",
                              lambda text: parse_candidate(text, theme, index))
