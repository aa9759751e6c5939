"""The hidden checks every tool environment carries (`spec.compiled_fields`), kept as a real module and
shipped by source text (`code_text`): `PRELUDE` (the store read-only: `db`, `rows`, `value`), and the
automatic checks that run after the environment's own: `SCHEMA_CHECK` (the store's schema is the
seed's) and, where the source lists what it may change, `UNCHANGED_CHECK` (every other seed row is
as seeded).

In the shipped test file `W` and `EXPECTED` are set by `families.base.tests_module`; here they are
placeholders a host-side test may set. `__SCHEMA_SQL__` stands for `SCHEMA_SQL`, written into the
shipped text as its literal.
"""

import json
import os
import pathlib
import sqlite3

from .code_text import source

SCHEMA_SQL = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
__SCHEMA_SQL__ = SCHEMA_SQL
W = pathlib.Path(os.environ.get("WORK", "/home/agent/work"))
EXPECTED: dict = {}


def db():
    """The store as the episode left it, read-only (its schema's SQL functions are not trusted)."""
    con = sqlite3.connect(f"file:{W / 'store.db'}?mode=ro", uri=True)
    con.execute("PRAGMA query_only = 1")
    con.execute("PRAGMA trusted_schema = OFF")
    con.row_factory = sqlite3.Row
    return con


def rows(sql, *params):
    con = db()
    try:
        return [dict(r) for r in con.execute(sql, params).fetchall()]
    finally:
        con.close()


def value(sql, *params):
    got = rows(sql, *params)
    return next(iter(got[0].values())) if got else None


def test_store_schema_unchanged():
    """The tables, indexes, views and triggers are the seed's: the checks read the real data."""
    got = [list(r.values()) for r in rows(__SCHEMA_SQL__)]
    assert got == EXPECTED["__schema__"], f"the store's schema changed: {got} (was {EXPECTED['__schema__']})"


def test_other_seed_rows_unchanged():
    """Every seed row the task may not change is still there, as seeded."""
    for table, spec in sorted(EXPECTED["__unchanged__"].items()):
        n = spec["keys"]
        got = {json.dumps(r[:n]): r for r in (list(d.values()) for d in rows(spec["sql"]))}
        for row in spec["rows"]:
            now = got.get(json.dumps(row[:n]))
            assert now == row, f"{table} row {row[:n]} changed: {now} (was {row})"


PRELUDE = "\nimport sqlite3\n\n" + "\n".join(source(f) for f in (db, rows, value))
SCHEMA_CHECK = "\n" + source(test_store_schema_unchanged).replace("__SCHEMA_SQL__", repr(SCHEMA_SQL))
UNCHANGED_CHECK = "\n" + source(test_other_seed_rows_unchanged)
