"""What the procedural tool families (environments of kind `tools`) share: `ToolFamily`, their base; an
in-Python table store that writes the seed SQL and the collateral expectations, tool-definition helpers,
the level knobs, and the checks every family appends (their code, like every tool's, is a real module
in `tool_code/`, shipped by its source text).

`ToolFamily` keeps the contract of terminal families (base.py): (family, level, seed) gives the same
environment byte for byte; the oracle call sequence passes the end-state checks and doing nothing fails
them; the checks carry their expected values, so the end state of seed A fails the checks of seed B;
instructions state the goal (implicit intents), never the call sequence.

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
from typing import Any, Callable, ClassVar, Iterator

from ....schemas.environment import EnvSpec
from ..tools.code_text import source, statements
from ..tools.spec import OracleCall, ToolDef, ToolTask, compiled_fields
from .base import Draft, Family
from .tool_code import common as code

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

HELPERS = "\nimport datetime as _dt\n\n" + statements(code, "_dicts", "_set")
COLLATERAL_CHECK = "\n" + source(code.test_nothing_else_changed)
REQUESTED_CHECK = "\n" + source(code.test_requested_changes)
ADDED_CHECK = "\n" + source(code.test_requested_additions)


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

    def namesake(self, rng: random.Random, **differ: list[Any]) -> tuple[int, int]:
        """In a table of people (keys 1..n; `name` and `email` columns): a target row and its namesake, the
        look-alike an agent must tell apart. The namesake takes the target's name, another e-mail and, for
        each column in `differ`, a value of its list other than the target's (drawn in column order).
        Returns the (target, namesake) keys."""
        target, twin = rng.sample(range(1, len(self.rows) + 1), 2)
        rows = self.by_key()
        name = rows[target][self.cols.index("name")]
        for i, col in enumerate(self.cols):
            if col == "name":
                rows[twin][i] = name
            elif col == "email":
                rows[twin][i] = email(name, rng.randint(100, 199))
            elif col in differ:
                rows[twin][i] = rng.choice([v for v in differ[col] if v != rows[target][i]])
        return target, twin


class Store:
    """The generated rows of a domain store (Python is the source of truth for expected values)."""

    def __init__(self) -> None:
        self.tables: dict[str, Table] = {}

    def add(self, name: str, columns: str, rows: list[list[Any]] | None = None) -> Table:
        """A table from its SQL column list ("id INTEGER PRIMARY KEY, name TEXT NOT NULL, ..."; no comma inside a
        column's definition; the first column is the key) and its rows."""
        cols = [c.strip().split(None, 1) for c in columns.split(",")]
        if any(len(c) != 2 for c in cols):
            raise ValueError(f"table {name!r}: every column needs a name and a type: {columns!r}")
        self.tables[name] = Table(name, [(c, decl) for c, decl in cols], [list(r) for r in rows or []])
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


def tool(fn: Callable, description: str, props: dict[str, Any] | None = None,
         required: list[str] | None = None) -> ToolDef:
    """The tool `fn` (a function of `tool_code/`, shipped by its source text) whose parameters are `props`
    (all required unless `required` says otherwise)."""
    props = props or {}
    return ToolDef(name=fn.__name__, description=description, code=textwrap.dedent(source(fn)).strip(),
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


# a tool more than one family offers
UPDATE_CUSTOMER_EMAIL = tool(code.update_customer_email, "Change a customer's e-mail address.",
                             {"customer_id": ID, "email": S})


class ToolFamily(Family):
    """A procedural family of tool environments. A domain family states its `domain`, `library` (the
    tools it may offer), `helpers` (its own helper code), `sizes` (level -> the keyword arguments of its
    `fill(store, rng, ...)`, which generates the store's rows; recorded as knobs) and `scenarios` (level ->
    the name of its method `(rng, store)` that makes the scenario, None when the store does not allow it:
    `task` then draws again, deterministic in rng). A family may override `attempt` (a store and its
    scenario) or `task` itself."""

    kind: ClassVar[str] = "tools"
    # the oracle names this instance's records (ids, names): it does not solve a sibling
    replay_invariant: ClassVar[bool] = False
    domain: ClassVar[str]
    library: ClassVar[list[ToolDef]]
    helpers: ClassVar[str] = ""
    sizes: ClassVar[dict[int, dict[str, Any]]] = {}
    scenarios: ClassVar[tuple[str, ...]] = ()

    @staticmethod
    def records_per_owner(rng: random.Random, owners: int) -> Iterator[int]:
        """Owner keys 1..`owners`, each repeated 1 to 3 times (drawn from `rng` before each owner's records):
        whose records (orders, tickets, bookings) a store starts with."""
        for owner in range(1, owners + 1):
            for _ in range(rng.randint(1, 3)):
                yield owner

    def fill(self, store: Store, rng: random.Random, **size: Any) -> None:
        raise NotImplementedError(f"tool family {self.name!r} defines no `fill`")

    def attempt(self, level: int, rng: random.Random) -> tuple[Store, Scenario | None]:
        store = Store()
        self.fill(store, rng, **self.sizes[level])
        return store, getattr(self, self.scenarios[level - 1])(rng, store)

    def task(self, level: int, rng: random.Random) -> ToolTask:
        """Generate one tool environment of `level` from `rng` (the only source of randomness)."""
        while True:  # regenerate until the scenario exists (deterministic in rng)
            store, made = self.attempt(level, rng)
            if made is not None:
                return make_task(level, rng, self.domain, store, made, self.library, self.helpers, **self.sizes[level])

    def draft(self, level: int, rng: random.Random) -> Draft:  # pragma: no cover - tool families compile tasks
        raise NotImplementedError("tool families generate ToolTasks (see `task`)")

    def generate(self, level: int, seed: int) -> EnvSpec:
        if level not in self.levels:
            raise ValueError(f"family {self.name!r} has levels {list(self.levels)}, not {level}")
        return self.env(level, seed, **compiled_fields(self.task(level, random.Random(f"{self.name}:{level}:{seed}"))))
