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
the same way (tasks/envs/tools/synthesis.py: same reply parsing, `ask`, `unsafe_tests`).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ...schemas.common import FileSpec, Reject
from ...schemas.config import safe_name
from ...schemas.environment import EnvSpec
from ...schemas.trajectory import Message
from .families.base import tests_module

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
FENCED_JSON = re.compile(r"```(?:json)?\s*\n(.*?)```", re.S)


# What hidden tests written by a model may import: reading and checking, nothing that runs code.
SAFE_IMPORTS = {"json", "os", "pathlib", "re", "math", "csv", "hashlib", "collections", "itertools", "datetime",
                "string", "textwrap", "statistics", "fractions", "decimal", "functools", "operator", "sqlite3",
                "configparser", "tomllib", "difflib", "unicodedata", "base64", "struct"}
UNSAFE_CALLS = {"system", "popen", "spawnl", "spawnv", "spawnve", "spawnlp", "execv", "execve", "execl", "execlp",
                "execvp", "startfile", "fork", "forkpty", "exec", "eval", "compile", "__import__", "import_module",
                "run_path", "run_module", "load_module", "exec_module", "chdir"}


def unsafe_tests(src: str) -> str | None:
    """Why model-written hidden tests could run agent-controlled code as root, or None. They run in
    the root test runner: the agent's programs must go through `run_as_agent`, and nothing the agent
    wrote may be imported (module names are looked up from the work dir the agent owns)."""
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
            for n in names:
                if node.__class__ is ast.ImportFrom and node.level:
                    return f"line {node.lineno}: relative import"
                if n.split(".")[0] not in SAFE_IMPORTS:
                    return f"line {node.lineno}: imports {n!r} (allowed: {', '.join(sorted(SAFE_IMPORTS))})"
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in UNSAFE_CALLS:
                return f"line {node.lineno}: calls {name}() (run agent programs with run_as_agent)"
        elif isinstance(node, ast.Attribute) and node.attr in ("path", "modules", "meta_path") and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            return f"line {node.lineno}: touches sys.{node.attr}"
        elif isinstance(node, ast.Name) and node.id in ("subprocess", "sys", "importlib", "runpy", "ctypes"):
            return f"line {node.lineno}: uses {node.id}"
    return None


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
        compile(v, "<tests>", "exec")
        return v


def extract_json(text: str) -> tuple[Any, str | None]:
    """(object, None) or (None, reason) from a model reply. An object that opens but never closes is
    `llm_bad_json` (a reply cut off at `synthesize.llm.max_tokens`), not `llm_no_json`."""
    blocks = FENCED_JSON.findall(text or "")
    candidates = blocks + [text or ""]
    opened = False
    for c in candidates:
        start = c.find("{")
        if start < 0:
            continue
        depth, in_str, esc, opened = 0, False, False, True
        for i, ch in enumerate(c[start:], start):
            if in_str:
                esc = (ch == "\\") and not esc
                if ch == '"' and not esc:
                    in_str = False
                continue
            if ch == '"':
                in_str, esc = True, False
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    try:
                        return json.loads(c[start:i + 1]), None
                    except ValueError as err:
                        return None, f"llm_bad_json: {err}"
    if opened:
        return None, "llm_bad_json: the JSON object never closes (reply cut off? raise synthesize.llm.max_tokens)"
    return None, "llm_no_json: no JSON object in the reply"


def schema_detail(err: ValidationError) -> str:
    """`field.path: message; ...` of a failed validation (the `llm_schema` reject's detail)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'object'}: {e['msg']}" for e in err.errors())


def reply_reject(text: str, key: str) -> tuple[Any, Reject | None]:
    """(the reply's JSON object, None) or (None, an `llm_no_json` / `llm_bad_json` reject)."""
    obj, problem = extract_json(text)
    if problem:
        reason, _, detail = problem.partition(": ")
        return None, Reject(key=key, reason=reason, detail=f"{detail} | reply: {(text or '')[:300]!r}")
    return obj, None


def parse_candidate(text: str, theme: str, index: int) -> tuple[EnvSpec | None, Reject | None]:
    key = f"llm:{safe_name(theme)}:{index}"
    obj, reject = reply_reject(text, key)
    if reject:
        return None, reject
    try:
        cand = Candidate.model_validate(obj)
    except (ValidationError, SyntaxError) as err:
        detail = schema_detail(err) if isinstance(err, ValidationError) else f"tests: {err}"
        return None, Reject(key=key, reason="llm_schema", detail=detail[:1000])
    for f in cand.files:
        if f.path.startswith("/") or ".." in f.path.split("/") or not f.path.strip():
            return None, Reject(key=key, reason="llm_unsafe_path", detail=f.path)
    problem = unsafe_tests(cand.tests)
    if problem:
        return None, Reject(key=key, reason="llm_unsafe_tests", detail=problem)
    env = EnvSpec(env_id="pending", family=f"llm-{safe_name(theme)}", level=cand.level, seed=index,
                  source=f"llm:{theme}", instruction=cand.instruction.strip(), files=cand.files,
                  tests=[FileSpec(path="test_task.py", content=tests_module({}, cand.tests))],
                  solution=cand.solution, knobs_json=json.dumps({"theme": theme}))
    env.env_id = f"llm-{safe_name(theme)[:24]}-{index}-{env.content_hash()[:8]}"
    return env, None


async def ask(teacher, system: str, prompt: str, index: int, session_id: str) -> tuple[str | None, str | None]:
    """(the teacher's reply text, None) or (None, the teacher error) for one system + user prompt."""
    from ..teachers import TeacherError

    session = teacher.session(None, index, session_id)
    try:
        turn = await session.next_turn([Message(role="system", content=system), Message(role="user", content=prompt)], [])
    except TeacherError as err:
        return None, str(err)[:500]
    return turn.message.content or "", None


async def propose(teacher, theme: str, index: int) -> tuple[EnvSpec | None, Reject | None]:
    """Ask the teacher for one candidate; every failure is a reject."""
    text, error = await ask(teacher, SYSTEM, PROMPT.format(theme=theme, index=index, example=json.dumps(EXAMPLE)),
                            index, f"llm-synthesis|{theme}|{index}")
    if error is not None:
        return None, Reject(key=f"llm:{safe_name(theme)}:{index}", reason="teacher_error", detail=error)
    return parse_candidate(text, theme, index)
