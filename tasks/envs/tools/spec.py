"""A tool environment before it is an `EnvSpec`: store, tools, task, end-state checks, oracle calls.

`ToolTask` is the one shape both sources write (procedural tool families and LLM synthesis from
themes); `compile_task` turns it into an ordinary `EnvSpec` of kind `tools`, so everything after
(image build, validator, rollouts, verification, calibration, export) is the terminal pipeline:

- files `.tools/server.py` (the MCP stdio server, `server.py` of this package), `.tools/tools.py`
  (the tools' code), `.tools/tools.json` (their MCP descriptions), `.tools/seed.sql` (schema + rows);
- setup `python3 -I .tools/server.py init`: the store `store.db` is created in the work dir at
  image build (then `seed.sql` is deleted), owned by the agent user the server runs as;
- hidden tests: the `checks` (`test_*` functions) after a prelude that opens the FINAL store read-only
  (`db()`, `rows(sql, *params)`, `value(sql, *params)`; `query_only`, `trusted_schema` off), with
  `EXPECTED` embedded: the verdict comes from the end state, never from the transcript; the prelude
  adds `test_store_schema_unchanged` (sqlite_master equals the seed's, recorded at compile time under
  `EXPECTED["__schema__"]` from the seed run in an in-memory SQLite on the host: pure data), and a
  task with `may_change` gets `test_other_seed_rows_unchanged` (every seed row whose key it does not
  list is still there, unchanged: `EXPECTED["__unchanged__"]`);
- solution: one `server.py call NAME 'ARGS'` command per oracle call (`call_command`), so the
  validator replays the oracle through the same server the agent uses;
- protected `.tools/*` and below (dotfiles too): the server and tools must not change during an episode.

Invariants: tool names are identifiers, unique, and never `submit` (the harness's own tool); each
`parameters` is a valid JSON Schema of an object (checked with `jsonschema`) using only the keywords
the server enforces (`SCHEMA_KEYWORDS`), its top level closed (`additionalProperties: false`, set if
absent), so host (`jsonschema`) and server agree on every call; every tool has code that defines a
function of its name; every oracle call names a declared tool; `expected` keys starting with `__`
are reserved; the seed script builds within `load_seed`'s bounds.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import sqlite3
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ....schemas.common import FileSpec
from ....schemas.environment import EnvSpec
from ....schemas.pysource import parse as parse_python
from ..families.base import tests_module
from .checks import PRELUDE, SCHEMA_CHECK, SCHEMA_SQL, UNCHANGED_CHECK

SERVER_SOURCE = Path(__file__).with_name("server.py")
CALL_SOURCE = Path(__file__).with_name("call.py")  # a brought server's one-shot client (formats/mcp_server.py)
TOOLS_DIR = ".tools"
STORE = "store.db"
RESERVED = {"submit"}
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# a call through the environment's own server (`server.py call`) or a brought one (`call.py`, formats/mcp_server.py)
CALL = re.compile(r"^python3 -I \.tools/(?:server\.py call|call\.py) (?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]*) (?P<args>.+)$",
                  re.S)
TOOL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # MCP's advice; shell-safe in a recorded command

# JSON-Schema keywords the server (server.schema_errors) enforces or that carry no constraint
SCHEMA_KEYWORDS = {"type", "properties", "required", "additionalProperties", "enum", "items", "minimum", "maximum",
                   "minLength", "maxLength", "description", "default", "title"}
SEED_MAX_BYTES = 512 << 10  # seed.sql (schema + rows)
SEED_MAX_VALUE = 1 << 20  # one string / blob / statement of the seed
SEED_MAX_PAGES = (64 << 20) // 4096  # the seeded store: 64 MiB
SEED_MAX_STEPS = 20_000  # progress-handler calls (x1000 SQLite VM instructions) the seed script may take

def unenforced(schema: Any, where: str = "parameters") -> str | None:
    """Why the server would not enforce `schema` as `jsonschema` does (a keyword outside
    `SCHEMA_KEYWORDS`, a boolean subschema, a schema-valued additionalProperties), or None."""
    if not isinstance(schema, dict):
        return f"{where} must be a JSON object schema, not {json.dumps(schema)}"
    extra = sorted(set(schema) - SCHEMA_KEYWORDS)
    if extra:
        return (f"{where} uses {', '.join(map(repr, extra))}, which the tool server does not enforce "
                f"(allowed: {', '.join(sorted(SCHEMA_KEYWORDS))})")
    if not isinstance(schema.get("additionalProperties", False), bool):
        return f"{where}.additionalProperties must be true or false"
    subs = [(f"{where}.properties.{k}", sub) for k, sub in schema.get("properties", {}).items()]
    if "items" in schema:
        subs.append((f"{where}.items", schema["items"]))
    return next((p for p in (unenforced(sub, at) for at, sub in subs) if p), None)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolDef(_Model):
    """One tool: its MCP description and its implementation `def <name>(db, **arguments)`."""

    name: str
    description: str = Field(min_length=3)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    code: str = Field(min_length=10)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.match(v) or v in RESERVED:
            raise ValueError(f"tool name {v!r} must be a lower-case identifier (not {', '.join(RESERVED)})")
        return v

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            Draft202012Validator.check_schema(v)
        except SchemaError as err:
            raise ValueError(f"not a valid JSON Schema: {err.message}") from None
        if v.get("type") != "object":
            raise ValueError("the parameters schema must have type 'object'")
        problem = unenforced(v)
        if problem:
            raise ValueError(problem)
        if v.get("additionalProperties", True) is True:  # unknown arguments: a call error, not a TypeError
            v = {**v, "additionalProperties": False}
        return v

    @model_validator(mode="after")
    def _defines_itself(self) -> "ToolDef":
        try:
            tree = parse_python(self.code)  # (one parse at a time in the process: schemas/pysource.py)
        except SyntaxError as err:
            raise ValueError(f"code of tool {self.name!r} does not parse: {err.msg} (line {err.lineno})") from None
        if not any(isinstance(n, ast.FunctionDef) and n.name == self.name for n in tree.body):
            raise ValueError(f"code of tool {self.name!r} must define `def {self.name}(db, ...)`")
        return self

    def mcp(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "inputSchema": self.parameters}


class OracleCall(_Model):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolTask(_Model):
    """A tool environment as its source writes it (see the module docstring)."""

    domain: str = Field(min_length=3, description="what system the tools operate, e.g. 'a hotel booking desk'")
    instruction: str = Field(min_length=20)
    schema_sql: str = Field(min_length=10)
    seed_sql: str = ""
    tools: list[ToolDef] = Field(min_length=1)
    helpers: str = Field("", description="Python shared by the tools (module level of tools.py)")
    checks: str = Field(min_length=10, description="`test_*` functions over the final store")
    expected: dict[str, Any] = Field(default_factory=dict)
    oracle: list[OracleCall] = Field(min_length=1)
    knobs: dict[str, Any] = Field(default_factory=dict)
    may_change: dict[str, list[Any]] | None = Field(None, description=(
        "table -> primary-key values (a list for a composite key; rowid for a table without a key) of the seed "
        "rows the task may change or delete: every other seed row is checked to be unchanged; None: no such "
        "generic check (procedural families check their collateral themselves)"))

    @model_validator(mode="after")
    def _consistent(self) -> "ToolTask":
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
        unknown = sorted({c.name for c in self.oracle} - set(names))
        if unknown:
            raise ValueError(f"oracle calls unknown tools {unknown}")
        if "def test_" not in self.checks:
            raise ValueError("checks define no test_* function")
        reserved = sorted(k for k in self.expected if k.startswith("__"))
        if reserved:
            raise ValueError(f"expected keys {reserved} are reserved (they start with '__')")
        return self


def call_command(name: str, arguments: dict[str, Any], brought: bool = False) -> str:
    """The shell command that makes one tool call through the environment's server (oracle steps):
    `server.py call` of a compiled `ToolTask`, `call.py` for a brought server (`mcp-server` folders)."""
    head = f"{TOOLS_DIR}/call.py" if brought else f"{TOOLS_DIR}/server.py call"
    name = name if TOOL_NAME.match(name) else shlex.quote(name)
    return f"python3 -I {head} {name} {shlex.quote(json.dumps(arguments, sort_keys=True))}"


def parse_call_command(command: str) -> tuple[str, dict[str, Any]] | None:
    """(tool name, arguments) of a `call_command`, None for any other command."""
    m = CALL.match(command.strip())
    if not m:
        return None
    try:
        parts = shlex.split(m["args"])
        args = json.loads(parts[0]) if len(parts) == 1 else None
    except ValueError:
        return None
    return (m["name"], args) if isinstance(args, dict) else None


class SeedError(ValueError):
    """The seed script does not build a store within `load_seed`'s bounds."""


# what a seed script may not do: reach other files (ATTACH, and so VACUUM INTO), lift the bounds (PRAGMA),
# keep objects outside the store (temp ones), create virtual tables, load extensions
SEED_DENIED = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH, sqlite3.SQLITE_PRAGMA, sqlite3.SQLITE_CREATE_TEMP_INDEX,
               sqlite3.SQLITE_CREATE_TEMP_TABLE, sqlite3.SQLITE_CREATE_TEMP_TRIGGER, sqlite3.SQLITE_CREATE_TEMP_VIEW,
               sqlite3.SQLITE_CREATE_VTABLE}


def seed_script(task: ToolTask) -> str:
    """`seed.sql`: the schema, then the rows (what `server.py init` runs at image build)."""
    return task.schema_sql.strip().rstrip(";") + ";\n" + task.seed_sql.strip() + "\n"


def load_seed(script: str) -> sqlite3.Connection:
    """An in-memory SQLite holding the store `script` builds, or SeedError naming the problem. Nothing
    reaches the host's files (`SEED_DENIED`) and the work is bounded: the script's size, each value's
    and statement's length, the store's pages, the VM steps (`SEED_MAX_*`)."""
    size = len(script.encode())
    if size > SEED_MAX_BYTES:
        raise SeedError(f"seed.sql is {size} bytes, over the {SEED_MAX_BYTES}-byte cap (SEED_MAX_BYTES)")
    con = sqlite3.connect(":memory:")
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, SEED_MAX_VALUE)
    con.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, SEED_MAX_VALUE)
    con.execute(f"PRAGMA max_page_count = {SEED_MAX_PAGES}")
    steps, refused = [0], []

    def authorize(action: int, _arg1: object, arg2: object, *_: object) -> int:
        if action in SEED_DENIED or action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() == "load_extension":
            refused.append(action)
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def bounded() -> int:
        steps[0] += 1
        return int(steps[0] > SEED_MAX_STEPS)

    con.set_authorizer(authorize)
    con.set_progress_handler(bounded, 1000)
    try:
        con.executescript(script)
        tables = con.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
    except sqlite3.Error as err:
        con.close()
        if refused:
            raise SeedError("ATTACH / DETACH / VACUUM INTO / PRAGMA / temporary or virtual tables / extensions are "
                            "not allowed (the store is one plain database)") from None
        if steps[0] > SEED_MAX_STEPS:
            raise SeedError("the seed script takes too long") from None
        raise SeedError(f"{err.__class__.__name__}: {err}") from None
    con.set_authorizer(None)
    con.set_progress_handler(None, 0)
    if not tables:
        con.close()
        raise SeedError("the schema creates no table")
    return con


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def unchanged_rows(con: sqlite3.Connection, may_change: dict[str, list[Any]]) -> dict[str, Any]:
    """`EXPECTED["__unchanged__"]`: per table of the seeded store `con`, the query listing its rows
    (key columns first: the primary key, else rowid; blobs as `blob:<hex>`) and the seed rows whose key
    `may_change` does not list. ValueError when `may_change` names a table or key the seed lacks."""
    tables = [r[0] for r in con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    unknown = sorted(set(may_change) - set(tables))
    if unknown:
        raise ValueError(f"may_change names tables the schema does not create: {unknown}")
    out: dict[str, Any] = {}
    for table in tables:
        info = con.execute(f"PRAGMA table_info({_ident(table)})").fetchall()  # cid, name, type, notnull, dflt, pk
        keys = [_ident(r[1]) for r in sorted(info, key=lambda r: r[5]) if r[5]] or ["rowid"]
        exprs = [f"CASE typeof({c}) WHEN 'blob' THEN 'blob:' || hex({c}) ELSE {c} END AS c{i}"
                 for i, c in enumerate(keys + [_ident(r[1]) for r in info])]
        sql = f"SELECT {', '.join(exprs)} FROM {_ident(table)} ORDER BY {', '.join(keys)}"
        seeded = [list(r) for r in con.execute(sql)]
        listed = {json.dumps(k if isinstance(k, list) else [k]) for k in may_change.get(table, [])}
        missing = sorted(listed - {json.dumps(r[:len(keys)]) for r in seeded})
        if missing:
            raise ValueError(f"may_change.{table}: {', '.join(missing)} match no seed row's key "
                             f"({', '.join(keys)})")
        out[table] = {"keys": len(keys), "sql": sql,
                      "rows": [r for r in seeded if json.dumps(r[:len(keys)]) not in listed]}
    return out


def compiled_fields(task: ToolTask) -> dict[str, Any]:
    """The `EnvSpec` fields of `task` (everything but ids, family, level, seed and source). Raises
    SeedError when the seed does not build, ValueError when `may_change` does not fit it."""
    script = seed_script(task)
    con = load_seed(script)
    try:
        expected = {**task.expected, "__schema__": [list(r) for r in con.execute(SCHEMA_SQL)]}
        checks = [PRELUDE, task.checks.strip(), SCHEMA_CHECK]  # the automatic checks last: they win
        if task.may_change is not None:
            expected["__unchanged__"] = unchanged_rows(con, task.may_change)
            checks.append(UNCHANGED_CHECK)
    finally:
        con.close()
    tools_py = "\n\n".join([task.helpers.strip(), *(t.code.strip() for t in task.tools)]).strip() + "\n"
    files = [
        FileSpec(path=f"{TOOLS_DIR}/server.py", content=SERVER_SOURCE.read_text()),
        FileSpec(path=f"{TOOLS_DIR}/tools.py", content=tools_py),
        FileSpec(path=f"{TOOLS_DIR}/tools.json", content=json.dumps([t.mcp() for t in task.tools], indent=1,
                                                                   sort_keys=True) + "\n"),
        FileSpec(path=f"{TOOLS_DIR}/seed.sql", content=script),
    ]
    return {
        "kind": "tools",
        "instruction": task.instruction.strip(),
        "files": files,
        "setup": [f"python3 -I {TOOLS_DIR}/server.py init", f"rm {TOOLS_DIR}/seed.sql"],
        "tests": [FileSpec(path="test_task.py", content=tests_module(expected, "\n\n".join(checks)))],
        "solution": [call_command(c.name, c.arguments) for c in task.oracle],
        "protected": [f"{TOOLS_DIR}/*", f"{TOOLS_DIR}/**/*", f"{TOOLS_DIR}/**/.*"],
        "knobs_json": json.dumps({"domain": task.domain, "tools": len(task.tools), "oracle_calls": len(task.oracle),
                                  **task.knobs}, sort_keys=True),
    }


def tool_view(env: EnvSpec, tests: bool = False) -> dict[str, Any]:
    """What a tool environment is about, without its files (`trajforge envs sample`): instruction, the tools its
    server offers (`.tools/tools.json`, or a brought server's recorded list), the oracle as tool calls, knobs (and the hidden checks with `tests`)."""
    files = {f.path: f.content for f in env.files}
    oracle = [parse_call_command(c) for c in env.solution]
    view = {"env_id": env.env_id, "kind": env.kind, "family": env.family, "level": env.level, "seed": env.seed,
            "instruction": env.instruction, "tools": json.loads(files.get(f"{TOOLS_DIR}/tools.json", "[]"))
            or json.loads(env.tool_server or "{}").get("tools", []),  # a brought server: what the validator recorded
            "oracle": [{"name": o[0], "arguments": o[1]} if o else {"command": c} for o, c in zip(oracle, env.solution)],
            "knobs": json.loads(env.knobs_json)}
    if tests:
        view["tests"] = [f.content for f in env.tests]
    return view
