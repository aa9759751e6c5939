"""LLM synthesis of tool environments from themes (`synthesize.llm.tool_themes`).

The teacher is asked for ONE JSON object, a `ToolTask` (spec.py) plus a `level`: the domain, the
user's goal (not a call sequence), the store's schema and seed rows, the tools (JSON-Schema
parameters + `def name(db, ...)` code), end-state checks with their `expected` values, and the oracle
calls. The reply goes through the shared parsing (`reply.reply_reject`: a ```json
block or the first balanced object), then strict validation; every problem is a reject, never a crash:

- `teacher_error`, `llm_no_json`, `llm_bad_json`: as for terminal tasks;
- `llm_schema`: the object breaks `ToolTask` (missing fields, an invalid parameters schema or one
  using a keyword the server does not enforce, an oracle call of an unknown tool or with arguments its
  parameters refuse, a tool whose code does not define it, checks that do not parse, no `may_change`
  or one naming a table or key the seed lacks...), the detail names the fields;
- `llm_unsafe_tests`: the checks (run as root by the verifier) fail `unsafe_tests`;
- `llm_unsafe_tools` (safety.py): tool or helper code imports outside `TOOL_IMPORTS`, or calls exec/eval/open/
  getattr/..., or reaches dunder attributes, sqlite extension loading, another connection, a script
  or the connection's hooks (tool code runs as the agent in the sandbox, without network; this keeps
  it plain data manipulation over `db`; the server's authorizer bounds what its SQL may do anyway);
- `llm_bad_sql`: schema + seed (the exact `seed.sql` the server runs) fail in an in-memory SQLite on
  the host (`spec.load_seed`: ATTACH / VACUUM INTO / PRAGMA denied; size, value length, pages and
  work bounded), or create no table;
- `llm_instruction_names_tools`: the instruction names a tool (dictates calls instead of a goal).

The reply's `may_change` ({table: keys of the seed rows the task changes or deletes}) gives every
accepted task the generic collateral check `test_other_seed_rows_unchanged` (spec.py).
Accepted tasks compile with `compiled_fields` into EnvSpecs of kind `tools`, source `llm:<theme>`,
family `llm-<theme>` (as terminal LLM environments), so the synthesize stage validates them like
every other source (oracle passes, no-op fails, deterministic). Tool code is never run on the host.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from jsonschema import Draft202012Validator
from pydantic import ConfigDict, Field, field_validator, model_validator

from ....schemas.common import Reject
from ....schemas.config import safe_name
from ....schemas.environment import EnvSpec
from ....schemas.pysource import parse as parse_python
from ..tools.spec import SCHEMA_KEYWORDS, SeedError, ToolTask, compiled_fields, load_seed, seed_script
from .reply import propose_with, synthesized, validated
from .safety import TOOL_IMPORTS, unsafe_tests, unsafe_tool_code

SYSTEM = ("You design self-contained tool-use tasks for training agents that call tools over a small SQLite "
          "database. Reply with exactly one JSON object and nothing else.")
PROMPT = """Theme: {theme}

Write one tool environment as a JSON object with these fields:
- "domain": the system the tools operate, a few words;
- "instruction": what the user wants, in the user's words: the goal and the facts the agent needs, never which
  tools to call or in what order, and no tool names; at least 20 characters;
- "schema_sql": SQLite CREATE TABLE statements of the store;
- "seed_sql": INSERT statements of the rows the task starts from;
- "tools": a list of {{"name": lower_snake_case, "description": what it does, "parameters": a JSON Schema of type
  object using only the keywords {keywords} (additionalProperties false), "code": Python source defining
  `def <name>(db, <parameters>)`}}; `db` is an open sqlite3 connection (rows are sqlite3.Row, committed when the
  tool returns; its SQL may read and change rows, never the schema); a tool returns JSON data (dicts, lists,
  strings, numbers, rows) and raises `ToolError("...")` for a domain error (it needs no import); it may import only
  {imports}; it never opens files, runs programs, or uses exec/eval/getattr/executescript;
- "helpers" (optional): Python functions the tools share, under the same rules;
- "checks": Python source defining functions named test_*, run on the store after the agent finished:
  `rows(sql, *params)` gives a list of dicts, `value(sql, *params)` the first column of the first row,
  `EXPECTED` is the "expected" object; each check asserts one property of the end state (what must have
  changed, and what must stay unchanged); no imports are needed;
- "expected": a JSON object of the values the checks compare with;
- "may_change": {{table: [primary-key values of the seed rows the task changes or deletes]}} (a table without
  a primary key: rowids); every other seed row is checked automatically to stay exactly as seeded;
- "oracle": the list of {{"name": tool, "arguments": {{...}}}} calls that accomplish the task from the seed
  state (doing nothing must fail the checks);
- "level": 1, 2 or 3 (difficulty: more tools, more steps, a lookup needed before acting).
Variant {index}. Example of the shape (a different theme):
{example}"""
EXAMPLE = {
    "domain": "a small library's lending desk",
    "instruction": "Maya Chen would like to borrow The Hobbit. Please lend her a copy that is available.",
    "schema_sql": "CREATE TABLE books(id INTEGER PRIMARY KEY, title TEXT NOT NULL, on_loan_to TEXT);",
    "seed_sql": "INSERT INTO books VALUES (1, 'The Hobbit', 'Sam Reed'), (2, 'The Hobbit', NULL), (3, 'Dune', NULL);",
    "tools": [
        {"name": "find_books", "description": "Copies of a book by title, with who has each on loan (null: available).",
         "parameters": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
                        "additionalProperties": False},
         "code": "def find_books(db, title):\n    return [dict(r) for r in db.execute("
                 "'SELECT id, title, on_loan_to FROM books WHERE title = ? ORDER BY id', (title,))]\n"},
        {"name": "lend_book", "description": "Lend the copy with this id to a member; fails if it is on loan.",
         "parameters": {"type": "object", "properties": {"book_id": {"type": "integer"},
                                                         "member": {"type": "string", "minLength": 1}},
                        "required": ["book_id", "member"], "additionalProperties": False},
         "code": "def lend_book(db, book_id, member):\n"
                 "    row = db.execute('SELECT on_loan_to FROM books WHERE id = ?', (book_id,)).fetchone()\n"
                 "    if row is None:\n        raise ToolError(f'no book {book_id}')\n"
                 "    if row['on_loan_to'] is not None:\n        raise ToolError(f'book {book_id} is on loan')\n"
                 "    db.execute('UPDATE books SET on_loan_to = ? WHERE id = ?', (member, book_id))\n"
                 "    return {'book_id': book_id, 'on_loan_to': member}\n"}],
    "checks": "def test_member_has_the_book():\n"
              "    assert value('SELECT COUNT(*) FROM books WHERE title = ? AND on_loan_to = ?', "
              "EXPECTED['title'], EXPECTED['member']) == 1\n\n"
              "def test_other_copies_unchanged():\n"
              "    assert rows('SELECT id, on_loan_to FROM books WHERE id != 2 ORDER BY id') == EXPECTED['others']\n",
    "expected": {"title": "The Hobbit", "member": "Maya Chen",
                 "others": [{"id": 1, "on_loan_to": "Sam Reed"}, {"id": 3, "on_loan_to": None}]},
    "may_change": {"books": [2]},
    "oracle": [{"name": "find_books", "arguments": {"title": "The Hobbit"}},
               {"name": "lend_book", "arguments": {"book_id": 2, "member": "Maya Chen"}}],
    "level": 1,
}


class ToolCandidate(ToolTask):
    """A teacher's reply: a `ToolTask` (unknown top-level keys ignored, tools and oracle calls strict)
    plus its difficulty; the checks must parse and define `test_*` functions at module level."""

    model_config = ConfigDict(extra="ignore")

    level: int = Field(2, ge=1, le=3)
    may_change: dict[str, list[Any]]  # required here: the generic collateral check of every LLM task

    @field_validator("checks")
    @classmethod
    def _checks_parse(cls, v: str) -> str:
        try:
            tree = parse_python(v)
        except SyntaxError as err:
            raise ValueError(f"does not parse: {err.msg} (line {err.lineno})") from None
        if not any(isinstance(n, ast.FunctionDef) and n.name.startswith("test_") for n in tree.body):
            raise ValueError("defines no test_* function")
        return v

    @field_validator("helpers")
    @classmethod
    def _helpers_parse(cls, v: str) -> str:
        try:
            parse_python(v)
        except SyntaxError as err:
            raise ValueError(f"does not parse: {err.msg} (line {err.lineno})") from None
        return v

    @model_validator(mode="after")
    def _oracle_arguments_fit(self) -> "ToolCandidate":
        """Each oracle call's arguments satisfy its tool's parameters (else the server refuses the call)."""
        params = {t.name: t.parameters for t in self.tools}
        for i, call in enumerate(self.oracle):
            if call.name not in params:
                continue  # ToolTask names the unknown tool
            err = next(iter(Draft202012Validator(params[call.name]).iter_errors(call.arguments)), None)
            if err is not None:
                raise ValueError(f"oracle.{i}.arguments do not fit the parameters of {call.name}: {err.message}")
        return self

    def task(self, theme: str) -> ToolTask:
        return ToolTask.model_validate(self.model_dump(exclude={"level", "knobs"}) | {"knobs": {"theme": theme}})


def sql_problem(script: str) -> str | None:
    """Why `script` (schema + seed) does not build a store, or None (`spec.load_seed`: in memory,
    nothing reaches the host's files, the work and memory are bounded)."""
    try:
        load_seed(script).close()
    except SeedError as err:
        return str(err)
    return None


def parse_tool_candidate(text: str, theme: str, index: int) -> tuple[EnvSpec | None, Reject | None]:
    """One tool environment from a teacher's reply, or the reject saying why not (module docstring)."""
    key = f"llm:{safe_name(theme)}:tools:{index}"
    cand, reject = validated(text, key, ToolCandidate)
    if reject:
        return None, reject
    for where, code in [("helpers", cand.helpers)] + [(f"tools.{t.name}", t.code) for t in cand.tools]:
        problem = unsafe_tool_code(code) if code.strip() else None
        if problem:
            return None, Reject(key=key, reason="llm_unsafe_tools", detail=f"{where}: {problem}")
    try:
        problem = unsafe_tests(cand.checks)
    except SyntaxError as err:  # pragma: no cover - ToolCandidate parsed the checks
        problem = str(err)
    if problem:
        return None, Reject(key=key, reason="llm_unsafe_tests", detail=f"checks: {problem}")
    task = cand.task(theme)
    problem = sql_problem(seed_script(task))
    if problem:
        return None, Reject(key=key, reason="llm_bad_sql", detail=problem[:1000])
    try:
        fields = compiled_fields(task)
    except ValueError as err:  # may_change does not fit the seed
        return None, Reject(key=key, reason="llm_schema", detail=str(err)[:1000])
    named = sorted(t.name for t in cand.tools if "_" in t.name and re.search(rf"\b{t.name}\b", cand.instruction))
    if named:
        return None, Reject(key=key, reason="llm_instruction_names_tools",
                            detail=f"the instruction names {named}: state the goal, not the calls")
    return synthesized(theme, index, cand.level, **fields), None


async def propose_tools(teacher, theme: str, index: int) -> tuple[EnvSpec | None, Reject | None]:
    """Ask the teacher for one tool environment of `theme`; every failure is a reject."""
    prompt = PROMPT.format(theme=theme, index=index, imports=", ".join(sorted(TOOL_IMPORTS)),
                           keywords=", ".join(sorted(SCHEMA_KEYWORDS)), example=json.dumps(EXAMPLE))
    return await propose_with(teacher, SYSTEM, prompt, index, f"llm-tool-synthesis|{theme}|{index}",
                              f"llm:{safe_name(theme)}:tools:{index}", lambda text: parse_tool_candidate(text, theme, index))
