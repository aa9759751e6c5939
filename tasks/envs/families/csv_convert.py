"""CSV to JSON conversion with types: `orders.csv` becomes `orders.json`, a list of objects in file order
with the typed columns the instruction specifies (ints, decimals, booleans, ISO dates, null for empty).

Knobs by level: rows (8 / 40 / 200), and quirks: level 2 adds quoted fields with commas, empty values
and dates given as DD/MM/YYYY; level 3 adds a UTF-8 byte-order mark, CRLF line endings, thousands
separators in amounts and mixed boolean spellings (yes/no/Y/N/true/false).
"""

from __future__ import annotations

import csv
import io
import random

from ....schemas.common import FileSpec
from .base import Draft, Family, tests_module

NAMES = ["Acme, Inc.", "Bolt Ltd", "Cobalt GmbH", "Delta & Sons", "Ember Co", "Flux LLC", "Gale, Hart & Co"]
SOLUTION = r"""python3 - <<'PY'
import csv, json, datetime
def boolean(v):
    return {'yes': True, 'y': True, 'true': True, 'no': False, 'n': False, 'false': False}[v.strip().lower()]
def date(v):
    v = v.strip()
    if '/' in v:
        d, m, y = v.split('/')
        return f'{int(y):04d}-{int(m):02d}-{int(d):02d}'
    return datetime.date.fromisoformat(v).isoformat()
conv = {'id': int, 'quantity': int, 'amount': lambda v: float(v.replace(',', '')), 'paid': boolean,
        'ordered_on': date, 'customer': str, 'note': str}
rows = []
with open('orders.csv', newline='', encoding='utf-8-sig') as f:
    for rec in csv.DictReader(f):
        rows.append({k: (None if v.strip() == '' else conv[k](v)) for k, v in rec.items()})
json.dump(rows, open('orders.json', 'w'), indent=2)
PY"""

TESTS = """
import math

def _rows():
    return json.loads((W / "orders.json").read_text())

def test_output_is_a_list_in_order():
    rows = _rows()
    assert isinstance(rows, list) and [r.get("id") for r in rows] == [r["id"] for r in EXPECTED["rows"]]

def test_types_and_values():
    bad = []
    for got, want in zip(_rows(), EXPECTED["rows"]):
        for k, v in want.items():
            g = got.get(k, "<missing>")
            if isinstance(v, float):
                ok = isinstance(g, (int, float)) and not isinstance(g, bool) and math.isclose(g, v, abs_tol=1e-9)
            else:
                ok = g == v and type(g) is type(v)
            if not ok:
                bad.append((want["id"], k, v, g))
    assert not bad, bad[:5]

def test_no_extra_keys():
    assert all(set(r) == set(EXPECTED["rows"][0]) for r in _rows())
"""


class CsvConvert(Family):
    name = "csv_convert"
    description = "convert a quirky CSV file to JSON with typed columns (ints, decimals, booleans, dates, nulls)"

    def draft(self, level: int, rng: random.Random) -> Draft:
        n_rows = {1: 8, 2: 40, 3: 200}[level]
        ids = rng.sample(range(1000, 99999), n_rows)
        rows, expected = [], []
        for i in range(n_rows):
            y, m, d = 2026, rng.randint(1, 12), rng.randint(1, 28)
            amount = round(rng.uniform(1, 25000 if level == 3 else 900), 2)
            paid = rng.choice([True, False])
            qty = rng.randint(1, 40)
            note = rng.choice(["", "rush", "gift, wrapped", "call first"]) if level >= 2 else rng.choice(["rush", "std"])
            customer = rng.choice(NAMES if level >= 2 else [n for n in NAMES if "," not in n])
            empty_qty = level >= 2 and rng.random() < 0.1
            raw = {
                "id": str(ids[i]),
                "customer": customer,
                "quantity": "" if empty_qty else str(qty),
                "amount": (f"{amount:,.2f}" if level == 3 and amount >= 1000 else f"{amount:.2f}"),
                "paid": (rng.choice(["yes", "Y", "true"] if paid else ["no", "N", "false"]) if level == 3
                         else ("true" if paid else "false")),
                "ordered_on": f"{d:02d}/{m:02d}/{y}" if level >= 2 and rng.random() < 0.5 else f"{y}-{m:02d}-{d:02d}",
                "note": note,
            }
            rows.append(raw)
            expected.append({"id": ids[i], "customer": customer, "quantity": None if empty_qty else qty,
                             "amount": amount, "paid": paid, "ordered_on": f"{y}-{m:02d}-{d:02d}",
                             "note": note or None})
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\r\n" if level == 3 else "\n")
        writer.writeheader()
        writer.writerows(rows)
        content = ("\ufeff" if level == 3 else "") + buf.getvalue()
        instruction = (
            "Convert `orders.csv` into `orders.json`: a JSON array with one object per data row, in file order, "
            "keyed by the CSV header names. Types: `id` and `quantity` are integers; `amount` is a number "
            "(it may contain thousands separators); `paid` is a boolean (the file may spell it yes/no, Y/N or "
            "true/false); `ordered_on` is an ISO date string YYYY-MM-DD (some rows use DD/MM/YYYY); "
            "`customer` and `note` are strings. An empty field becomes null. Add no other keys."
        )
        return Draft(instruction, [FileSpec(path="orders.csv", content=content)],
                     tests_module({"rows": expected}, TESTS), [SOLUTION],
                     {"rows": n_rows, "bom": level == 3, "crlf": level == 3}, protected=["orders.csv"])
