"""The code every procedural tool family ships into the sandbox, kept as a real module and shipped by
source text (tasks/envs/tools/code_text.py): the helpers its tools share (`_dicts` to `_set`),
the end-state checks every family appends (requested changes, requested additions, nothing else
changed; `EXPECTED` and `rows`/`value` are the hidden test file's, see tasks/envs/tools/checks.py), and
the tools more than one family offers.
"""

import datetime as _dt

from ...tools.checks import EXPECTED, rows, value
from ...tools.server import ToolError


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


def _like(db, sql, text, missing):
    """The rows of `sql`, each of whose `?` is `%text%` lowercased (a case-insensitive search); the
    ToolError `missing` when there are none."""
    q = f"%{text.strip().lower()}%"
    found = _dicts(db.execute(sql, (q,) * sql.count("?")))
    if not found:
        raise ToolError(missing)
    return found


def _cancel(db, table, row, what):
    """Cancel `row` of `table` (a dict with its `id` and `status`), which must be confirmed."""
    if row["status"] != "confirmed":
        raise ToolError(f"{what} {row['id']} is already {row['status']}")
    db.execute(f"UPDATE {table} SET status = 'cancelled' WHERE id = ?", (row["id"],))
    return {"id": row["id"], "status": "cancelled"}


def _set(db, fetch, key, sql, *params):
    """Run `sql` on the row `fetch(db, key)` finds (`fetch` raises a ToolError when there is none, or when
    it may not change); the row as it is after."""
    fetch(db, key)
    db.execute(sql, params)
    return fetch(db, key)


def test_nothing_else_changed():
    for table, spec in sorted(EXPECTED["collateral"].items()):
        cols = spec["cols"]
        got = {r[cols[0]]: [r[c] for c in cols] for r in rows(f"SELECT {', '.join(cols)} FROM {table}")}
        for row in spec["rows"]:
            assert got.get(row[0]) == row, f"{table} {cols[0]}={row[0]!r} changed: {got.get(row[0])} (was {row})"
        original = {row[0] for row in spec["rows"]} | set(spec["changed"])
        new = sorted(k for k in got if k not in original)
        assert len(new) <= spec["added"], f"{table}: {len(new)} new rows {new[:5]}, at most {spec['added']} expected"


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


def test_requested_additions():
    for table, want in EXPECTED["added"]:
        where = " AND ".join(f"{c} = ?" for c in want)
        n = value(f"SELECT COUNT(*) FROM {table} WHERE {where}", *want.values())
        assert n == 1, f"{table}: expected one row with {want}, found {n}"


def update_customer_email(db, customer_id, email):
    _one(db, "SELECT id FROM customers WHERE id = ?", (customer_id,), f"no customer {customer_id}")
    if "@" not in email:
        raise ToolError(f"not an e-mail address: {email!r}")
    db.execute("UPDATE customers SET email = ? WHERE id = ?", (email, customer_id))
    return {"customer_id": customer_id, "email": email}
