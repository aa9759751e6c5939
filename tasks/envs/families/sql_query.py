"""Answer a question with SQL over a sqlite file: `shop.db` (customers, products, orders, order items)
is created at image build time from a dump that is then deleted. Expected answers are computed in
Python from the generated rows, independently of SQL.

Knobs by level: level 1 counts orders with a status (one table); level 2 finds the customer with the
highest spend on shipped orders in a month (three-table join, unique by construction); level 3 gives
revenue per region for shipped or delivered orders in a quarter excluding refunded items, as JSON
(four tables, a filter on items, regions without revenue must appear with 0).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict

from ....schemas.common import FileSpec
from .base import Draft, Family, tests_module

REGIONS = ["north", "south", "east", "west", "central"]
FIRST = ["Ana", "Ben", "Chen", "Dana", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]
LAST = ["Novak", "Okafor", "Park", "Quinn", "Rossi", "Silva", "Tanaka", "Ueda", "Voss", "Weber"]
STATUSES = ["pending", "shipped", "delivered", "cancelled"]

TESTS = """
def _answer():
    return (W / EXPECTED["file"]).read_text()

def test_answer_file_exists():
    assert (W / EXPECTED["file"]).is_file()

def test_answer():
    if EXPECTED["file"].endswith(".json"):
        got = json.loads(_answer())
        want = EXPECTED["answer"]
        assert set(got) == set(want), sorted(got)
        bad = {k: got[k] for k in want if abs(float(got[k]) - want[k]) > 0.005}
        assert not bad, bad
    else:
        assert _answer().strip() == str(EXPECTED["answer"])

def test_database_untouched():
    import sqlite3
    db = sqlite3.connect(f"file:{W / 'shop.db'}?mode=ro", uri=True)
    counts = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in EXPECTED["counts"]}
    assert counts == EXPECTED["counts"], counts
"""


class SqlQuery(Family):
    """The reference solution's query carries the question's literals (a month, a status, a quarter), so
    it does not solve a sibling: not `replay_invariant`."""

    name = "sql_query"
    description = "answer a question with SQL over a sqlite database of customers, products and orders"
    replay_invariant = False

    def draft(self, level: int, rng: random.Random) -> Draft:
        n_customers, n_orders = {1: (6, 25), 2: (15, 120), 3: (30, 400)}[level]
        while True:  # regenerate until the level-2 answer is unique
            data = self._data(rng, n_customers, n_orders)
            answer, file, question, sql = self._question(level, rng, data)
            if answer is not None:
                break
        customers, products, orders, items = data
        dump = ["CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, region TEXT NOT NULL);",
                "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL);",
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), "
                "status TEXT NOT NULL, created TEXT NOT NULL);",
                "CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), product_id INTEGER NOT NULL "
                "REFERENCES products(id), qty INTEGER NOT NULL, unit_price REAL NOT NULL, refunded INTEGER NOT NULL DEFAULT 0);"]
        dump += [f"INSERT INTO customers VALUES ({c}, '{n}', '{r}');" for c, (n, r) in customers.items()]
        dump += [f"INSERT INTO products VALUES ({p}, '{n}', '{c}');" for p, (n, c) in products.items()]
        dump += [f"INSERT INTO orders VALUES ({o}, {c}, '{s}', '{d}');" for o, (c, s, d) in orders.items()]
        dump += [f"INSERT INTO order_items VALUES ({o}, {p}, {q}, {u}, {r});" for o, p, q, u, r in items]
        setup = ["sqlite3 shop.db < shop.sql", "rm -f shop.sql"]
        solution = [f"sqlite3 shop.db \"{sql}\" > {file}" if not file.endswith(".json") else sql]
        instruction = (f"`shop.db` is a SQLite database of a small shop (tables customers, products, orders, "
                       f"order_items; inspect the schema yourself). {question} Do not modify the database.")
        expected = {"answer": answer, "file": file, "counts": {"customers": len(customers), "products": len(products),
                                                               "orders": len(orders), "order_items": len(items)}}
        files = [FileSpec(path="shop.sql", content="BEGIN;\n" + "\n".join(dump) + "\nCOMMIT;\n")]
        if level == 3:
            files.append(FileSpec(path="regions.json", content=json.dumps(REGIONS) + "\n"))
        return Draft(instruction, files,
                     tests_module(expected, TESTS), solution,
                     {"customers": n_customers, "orders": n_orders, "question": level}, setup=setup,
                     protected=["shop.db", "regions.json"])

    @staticmethod
    def _data(rng: random.Random, n_customers: int, n_orders: int):
        customers = {i: (f"{rng.choice(FIRST)} {rng.choice(LAST)} {i}", rng.choice(REGIONS[:4]))
                     for i in range(1, n_customers + 1)}
        products = {i: (f"item-{i}", rng.choice(["tools", "books", "garden", "toys"])) for i in range(1, 13)}
        orders, items = {}, []
        for o in range(1, n_orders + 1):
            status = rng.choices(STATUSES, [2, 5, 3, 1])[0]
            created = f"2026-{rng.randint(1, 6):02d}-{rng.randint(1, 28):02d}"
            orders[o] = (rng.randint(1, n_customers), status, created)
            for p in rng.sample(sorted(products), rng.randint(1, 3)):
                items.append((o, p, rng.randint(1, 5), round(rng.uniform(2, 80), 2), int(rng.random() < 0.1)))
        return customers, products, orders, items

    @staticmethod
    def _question(level: int, rng: random.Random, data):
        customers, products, orders, items = data
        if level == 1:
            status = rng.choice(["shipped", "delivered", "pending"])
            answer = sum(1 for _, s, _ in orders.values() if s == status)
            return (answer, "answer.txt", f"How many orders have status '{status}'? Write just the number to "
                    "`answer.txt`.", f"SELECT COUNT(*) FROM orders WHERE status = '{status}';")
        if level == 2:
            month = f"2026-{rng.randint(1, 6):02d}"
            spend: dict[int, float] = defaultdict(float)
            for o, p, q, u, r in items:
                c, s, d = orders[o]
                if s == "shipped" and d.startswith(month):
                    spend[c] += q * u
            if not spend:
                return None, "", "", ""
            ranked = sorted(spend.items(), key=lambda kv: -kv[1])
            if len(ranked) > 1 and abs(ranked[0][1] - ranked[1][1]) < 0.01:
                return None, "", "", ""
            sql = ("SELECT c.name FROM customers c JOIN orders o ON o.customer_id = c.id JOIN order_items i "
                   f"ON i.order_id = o.id WHERE o.status = 'shipped' AND o.created LIKE '{month}-%' "
                   "GROUP BY c.id ORDER BY SUM(i.qty * i.unit_price) DESC LIMIT 1;")
            return (customers[ranked[0][0]][0], "answer.txt",
                    f"Which customer spent the most (sum of qty × unit_price over their items) on orders with status "
                    f"'shipped' created in {month}? Write just the customer's name to `answer.txt`.", sql)
        quarter = rng.choice([1, 2])
        months = {1: ("01", "02", "03"), 2: ("04", "05", "06")}[quarter]
        revenue = {r: 0.0 for r in REGIONS}
        for o, p, q, u, r in items:
            c, s, d = orders[o]
            if s in ("shipped", "delivered") and d[5:7] in months and not r:
                revenue[customers[c][1]] += q * u
        answer = {k: round(v, 2) for k, v in revenue.items()}
        sql = (r"""python3 - <<'PY'
import json, sqlite3
db = sqlite3.connect('file:shop.db?mode=ro', uri=True)
regions = [r for (r,) in db.execute("SELECT DISTINCT region FROM customers")]
rows = db.execute('''SELECT c.region, SUM(i.qty * i.unit_price) FROM order_items i JOIN orders o ON o.id = i.order_id
    JOIN customers c ON c.id = o.customer_id WHERE o.status IN ('shipped', 'delivered') AND i.refunded = 0
    AND CAST(substr(o.created, 6, 2) AS INTEGER) BETWEEN %d AND %d GROUP BY c.region''').fetchall()
out = {r: 0.0 for r in sorted(set(regions) | set(json.load(open('regions.json'))))}
out.update({r: round(v, 2) for r, v in rows})
json.dump(out, open('answer.json', 'w'), indent=2)
PY""" % (int(months[0]), int(months[-1])))
        return (answer, "answer.json",
                f"For Q{quarter} 2026 (months {months[0]}–{months[-1]}), compute each region's revenue: the sum of "
                "qty × unit_price over order items that were not refunded, of orders with status 'shipped' or "
                "'delivered'. Write `answer.json` mapping every region listed in `regions.json` to its revenue "
                "rounded to 2 decimals (0 for a region without revenue).", sql)
