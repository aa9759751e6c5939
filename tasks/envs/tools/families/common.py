"""What the procedural tool families share: an in-Python table store that writes the seed SQL and the
collateral expectations, tool-definition helpers, the level knobs, and the checks every family appends.

Invariants:
- the first column of every table is its unique key (so "which rows changed" is well defined);
- values are ints, strings or None (no floats: money is in cents), so `EXPECTED` round-trips JSON exactly;
- `Store.collateral(changed, added)` lists every row the task must NOT touch, computed from the generated
  data; `COLLATERAL_CHECK` compares the final store with it, so "cancel all", "reset and recreate" or
  any extra mutation fails, and so does the solved state of another seed (its rows differ); the rows
  a task must add are checked by `ADDED_CHECK` (exactly one of each), extra new rows by the collateral;
- the tools an instance offers are the oracle's tools plus `DISTRACTORS[level]` others of the family's
  library, in name order (the listing never tells which ones are needed).
"""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass, field
from typing import Any

from ..spec import OracleCall, ToolDef, ToolTask

# level -> how many of the library's tools the oracle does not need are offered besides its own
DISTRACTORS = {1: 1, 2: 3, 3: 6}
INTENT = {1: "explicit", 2: "implicit", 3: "implicit, several goals"}
LOOKUP = {1: "record named directly", 2: "name -> id lookup", 3: "two records match, a detail disambiguates"}

FIRST = ["Ana", "Ben", "Chen", "Dana", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Mira", "Noor",
         "Omar", "Pia", "Rafe", "Sana", "Theo", "Uma", "Vik", "Wen", "Yara", "Zoe"]
LAST = ["Novak", "Okafor", "Park", "Quinn", "Rossi", "Silva", "Tanaka", "Ueda", "Voss", "Weber", "Adler", "Brandt",
        "Costa", "Duarte", "Engel", "Fischer", "Garcia", "Holm", "Iqbal", "Jensen"]

S = {"type": "string", "minLength": 1}
ID = {"type": "integer", "minimum": 1}
DATE = {"type": "string", "minLength": 10, "maxLength": 10, "description": "YYYY-MM-DD"}

HELPERS = '''
import datetime as _dt


def _dicts(cur):
    return [dict(r) for r in cur.fetchall()]


def _one(db, sql, params, missing):
    row = db.execute(sql, params).fetchone()
    if row is None:
        raise ToolError(missing)
    return dict(row)


def _date(text, what="date"):
    try:
        return _dt.date.fromisoformat(text)
    except ValueError:
        raise ToolError(f"{what} must be YYYY-MM-DD, got {text!r}") from None
'''

COLLATERAL_CHECK = '''
def test_nothing_else_changed():
    for table, spec in sorted(EXPECTED["collateral"].items()):
        cols = spec["cols"]
        got = {r[cols[0]]: [r[c] for c in cols] for r in rows(f"SELECT {', '.join(cols)} FROM {table}")}
        for row in spec["rows"]:
            assert got.get(row[0]) == row, f"{table} {cols[0]}={row[0]!r} changed: {got.get(row[0])} (was {row})"
        original = {row[0] for row in spec["rows"]} | set(spec["changed"])
        new = sorted(k for k in got if k not in original)
        assert len(new) <= spec["added"], f"{table}: {len(new)} new rows {new[:5]}, at most {spec['added']} expected"
'''


REQUESTED_CHECK = '''
def test_requested_changes():
    for table, key, want in EXPECTED["after"]:
        col = EXPECTED["collateral"][table]["cols"][0]
        got = rows(f"SELECT * FROM {table} WHERE {col} = ?", key)
        if want is None:
            assert not got, f"{table} {col}={key!r} should be gone"
            continue
        assert got, f"{table} {col}={key!r} is missing"
        bad = {c: got[0][c] for c in want if got[0][c] != want[c]}
        assert not bad, f"{table} {col}={key!r}: got {bad}, want { {c: want[c] for c in bad} }"
'''


ADDED_CHECK = '''
def test_requested_additions():
    for table, want in EXPECTED["added"]:
        where = " AND ".join(f"{c} = ?" for c in want)
        n = value(f"SELECT COUNT(*) FROM {table} WHERE {where}", *want.values())
        assert n == 1, f"{table}: expected one row with {want}, found {n}"
'''


def sql_literal(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise TypeError(f"store values are int, str or None, not {type(v).__name__}")
    return str(v) if isinstance(v, int) else "'" + v.replace("'", "''") + "'"


@dataclass
class Table:
    name: str
    columns: list[tuple[str, str]]  # (name, SQL type and constraints); the first one is the key
    rows: list[list[Any]] = field(default_factory=list)

    @property
    def cols(self) -> list[str]:
        return [c for c, _ in self.columns]

    def by_key(self) -> dict[Any, list[Any]]:
        return {r[0]: r for r in self.rows}

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.cols, r)) for r in self.rows]


class Store:
    """The generated rows of a domain store (Python is the source of truth for expected values)."""

    def __init__(self) -> None:
        self.tables: dict[str, Table] = {}

    def add(self, name: str, columns: list[tuple[str, str]], rows: list[list[Any]] | None = None) -> Table:
        self.tables[name] = Table(name, columns, [list(r) for r in rows or []])
        return self.tables[name]

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]

    def schema_sql(self) -> str:
        return "\n".join(f"CREATE TABLE {t.name} ({', '.join(f'{c} {d}' for c, d in t.columns)});"
                         for t in self.tables.values())

    def seed_sql(self) -> str:
        """The rows as INSERTs in one transaction (one fsync, not one per row, at image build)."""
        rows = [f"INSERT INTO {t.name} VALUES ({', '.join(sql_literal(v) for v in r)});"
                for t in self.tables.values() for r in t.rows]
        return "\n".join(["BEGIN;", *rows, "COMMIT;"])

    def row_count(self) -> int:
        return sum(len(t.rows) for t in self.tables.values())

    def collateral(self, changed: dict[str, list[Any]] | None = None, added: dict[str, int] | None = None) -> dict:
        """Per table: the rows that must stay exactly as seeded, the keys the task may change (or
        delete), and how many new rows it must add."""
        changed, added = changed or {}, added or {}
        out = {}
        for t in self.tables.values():
            skip = list(changed.get(t.name, []))
            out[t.name] = {"cols": t.cols, "changed": skip, "added": added.get(t.name, 0),
                           "rows": [r for r in t.rows if r[0] not in skip]}
        return out


def after(table: Table, key: Any, deleted: bool = False, **changes: Any) -> list[Any]:
    """One entry of `EXPECTED["after"]`: the full row `key` of `table` once the task is done."""
    row = table.by_key()[key]
    if deleted:
        return [table.name, key, None]
    unknown = sorted(set(changes) - set(table.cols))
    if unknown:
        raise KeyError(f"{table.name} has no columns {unknown}")
    return [table.name, key, {**dict(zip(table.cols, row)), **changes}]


def tool(name: str, description: str, code: str, props: dict[str, Any] | None = None,
         required: list[str] | None = None) -> ToolDef:
    """A tool whose parameters are `props` (all required unless `required` says otherwise)."""
    props = props or {}
    return ToolDef(name=name, description=description, code=textwrap.dedent(code).strip(),
                   parameters={"type": "object", "properties": props,
                               "required": list(props) if required is None else required,
                               "additionalProperties": False})


def offer(level: int, rng: random.Random, library: list[ToolDef], oracle: list[OracleCall]) -> list[ToolDef]:
    """The oracle's tools plus `DISTRACTORS[level]` others of `library`, sorted by name."""
    needed = {c.name for c in oracle}
    by_name = {t.name: t for t in library}
    missing = sorted(needed - set(by_name))
    if missing:
        raise ValueError(f"the oracle calls tools outside the library: {missing}")
    others = sorted(set(by_name) - needed)
    chosen = sorted(needed) + rng.sample(others, min(DISTRACTORS[level], len(others)))
    return [by_name[n] for n in sorted(chosen)]


def knobs(level: int, store: Store, tools: list[ToolDef], oracle: list[OracleCall], **extra: Any) -> dict[str, Any]:
    needed = {c.name for c in oracle}
    return {"level": level, "distractors": sum(t.name not in needed for t in tools), "intent": INTENT[level],
            "lookup": LOOKUP[level], "rows": store.row_count(), **extra}


def call(tool_name: str, /, **arguments: Any) -> OracleCall:
    return OracleCall(name=tool_name, arguments=arguments)


def people(rng: random.Random, n: int) -> list[str]:
    """`n` distinct full names."""
    pool = [f"{first} {last}" for first in FIRST for last in LAST]
    return rng.sample(pool, n)


def email(name: str, n: int) -> str:
    first, last = name.lower().split()
    return f"{first}.{last}{n}@example.com"


@dataclass
class Scenario:
    """What a family's level generator decides: the request, the oracle, and the rows it changes."""

    instruction: str
    oracle: list[OracleCall]
    after: list[list[Any]]  # `after(...)` entries: rows changed or deleted
    changed: dict[str, list[Any]]  # table -> keys the task may change or delete
    added: list[list[Any]] = field(default_factory=list)  # [table, {col: value}]: rows the task must add


def make_task(level: int, rng: random.Random, domain: str, store: Store, scenario: Scenario,
              library: list[ToolDef], helpers: str, **extra_knobs: Any) -> ToolTask:
    """The `ToolTask` of a scenario: tools offered for `level`, checks, EXPECTED computed from `store`."""
    tools = offer(level, rng, library, scenario.oracle)
    added: dict[str, int] = {}
    for table, _ in scenario.added:
        added[table] = added.get(table, 0) + 1
    expected = {"after": scenario.after, "added": scenario.added,
                "collateral": store.collateral(scenario.changed, added)}
    return ToolTask(domain=domain, instruction=scenario.instruction, schema_sql=store.schema_sql(),
                    seed_sql=store.seed_sql(), tools=tools, helpers=HELPERS + helpers,
                    checks=REQUESTED_CHECK + ADDED_CHECK + COLLATERAL_CHECK, expected=expected,
                    oracle=scenario.oracle, knobs=knobs(level, store, tools, scenario.oracle, **extra_knobs))
