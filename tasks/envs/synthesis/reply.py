"""The reply side of LLM synthesis, shared by every kind (terminal.py, tools.py): asking the teacher, the
lenient parse of its reply (a ```json block or the first balanced object), the reject a malformed
reply is, and the environment an accepted candidate becomes.

Invariants: a reply never crashes synthesis (every problem is a `Reject` with its reason); an accepted
candidate of `theme` #`index` is an `EnvSpec` of family `llm-<theme>`, source `llm:<theme>`, seed
`index`, whose id ends with its content hash (`synthesized`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from ....schemas.common import Reject
from ....schemas.config import safe_name
from ....schemas.environment import EnvSpec
from ....schemas.trajectory import Message

FENCED_JSON = re.compile(r"```(?:json)?\s*\n(.*?)```", re.S)
Parsed = tuple[EnvSpec | None, Reject | None]


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


async def ask(teacher, system: str, prompt: str, index: int, session_id: str) -> tuple[str | None, str | None]:
    """(the teacher's reply text, None) or (None, the teacher error) for one system + user prompt."""
    from ...teachers import TeacherError

    session = teacher.session(None, index, session_id)
    try:
        turn = await session.next_turn([Message(role="system", content=system), Message(role="user", content=prompt)], [])
    except TeacherError as err:
        return None, str(err)[:500]
    return turn.message.content or "", None


def validated(text: str, key: str, model: type[BaseModel]) -> tuple[Any, Reject | None]:
    """(the reply's object validated as `model`, None) or (None, its `llm_no_json` / `llm_bad_json` /
    `llm_schema` reject: the detail names the fields)."""
    obj, reject = reply_reject(text, key)
    if reject:
        return None, reject
    try:
        return model.model_validate(obj), None
    except (ValidationError, SyntaxError) as err:  # SyntaxError: a validator compiled code
        detail = schema_detail(err) if isinstance(err, ValidationError) else f"tests: {err}"
        return None, Reject(key=key, reason="llm_schema", detail=detail[:1000])


async def propose_with(teacher, system: str, prompt: str, index: int, session_id: str, key: str,
                       parse: Callable[[str], Parsed]) -> Parsed:
    """Ask the teacher and parse its reply with `parse`; a teacher error is the `teacher_error` reject of `key`."""
    text, error = await ask(teacher, system, prompt, index, session_id)
    if error is not None:
        return None, Reject(key=key, reason="teacher_error", detail=error)
    return parse(text)


def synthesized(theme: str, index: int, level: int, **fields: Any) -> EnvSpec:
    """The environment candidate #`index` of `theme` becomes (its id ends with its content hash)."""
    env = EnvSpec(env_id="pending", family=f"llm-{safe_name(theme)}", level=level, seed=index,
                  source=f"llm:{theme}", **fields)
    env.env_id = f"llm-{safe_name(theme)[:24]}-{index}-{env.content_hash()[:8]}"
    return env

