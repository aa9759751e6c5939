"""A shop's order desk: customers, products with stock, orders and their lines behind lookup, order
editing and (distractor) back-office tools. Every order edit moves stock, so the checks see both.

Knobs by level (see `common`): level 1 cancels a pending order named by its number (its stock goes
back; 2 calls, 1 distractor tool); level 2 swaps one product for another in the pending order of a
customer named by name only (customer -> order -> product sku: 6 calls, 3 distractors); level 3 raises
one line's quantity and drops whatever in the order is discontinued, which only the product records
say, while another customer has the same name (the city disambiguates; 7-8 calls, 6 distractors).
Expected rows and stock levels are computed here in Python from the generated data.
"""

from __future__ import annotations

import random

from ..tools.code_text import statements
from .tool_base import ID, UPDATE_CUSTOMER_EMAIL, S, Scenario, Store, ToolFamily, after, call, email, people, tool
from .tool_code import orders as code

CITIES = ["Lisbon", "Porto", "Lyon", "Ghent", "Leeds", "Graz", "Turin", "Malmo", "Bergen", "Krakow"]
ADJ = ["Bamboo", "Steel", "Linen", "Ceramic", "Walnut", "Copper", "Wool", "Glass", "Cork", "Slate"]
NOUN = ["cutting board", "water bottle", "tea towel", "mug", "desk lamp", "kettle", "blanket", "vase", "spice rack",
        "coaster set", "bread bin", "plant pot"]
SKU = {"type": "string", "minLength": 8, "maxLength": 8, "description": "like SKU-1234"}
QTY = {"type": "integer", "minimum": 1, "maximum": 50}

DOMAIN_HELPERS = statements(code, "_order", "_take")

LIBRARY = [  # look-ups first, then the tools that change the shop
    tool(code.find_customer, "Find customers whose name or e-mail contains the text; returns id, name, e-mail, city.",
         {"text": {"type": "string", "minLength": 2}}),
    tool(code.list_orders, "A customer's orders (optionally only one status), newest first.",
         {"customer_id": ID, "status": {"type": "string", "enum": ["pending", "shipped", "delivered", "cancelled"]}},
         ["customer_id"]),
    tool(code.get_order, "One order with its lines (sku, product name, quantity, unit price in cents).",
         {"order_id": ID}),
    tool(code.search_products, "Products whose name contains the text: sku, name, price in cents.",
         {"text": {"type": "string", "minLength": 2}}),
    tool(code.get_product, "One product: name, price, units in stock and whether it is discontinued.", {"sku": SKU}),
    tool(code.get_shipping_quote, "Estimated shipping cost and days for an order.", {"order_id": ID}),
    tool(code.list_warehouses, "The warehouses the shop ships from."),
    tool(code.set_quantity, "Change how many units of a product a pending order has (stock follows).",
         {"order_id": ID, "sku": SKU, "qty": QTY}),
    tool(code.add_item, "Add a product that is not in a pending order yet (stock follows).",
         {"order_id": ID, "sku": SKU, "qty": QTY}),
    tool(code.remove_item, "Remove a product from a pending order; its units go back to stock.",
         {"order_id": ID, "sku": SKU}),
    tool(code.cancel_order, "Cancel a pending order; all its units go back to stock.", {"order_id": ID}),
    UPDATE_CUSTOMER_EMAIL,
    tool(code.issue_refund, "Refund an amount (cents) on a shipped or delivered order.",
         {"order_id": ID, "amount_cents": {"type": "integer", "minimum": 1}}),
    tool(code.restock_product, "Record units of a product received from the supplier.", {"sku": SKU, "qty": QTY}),
    tool(code.apply_coupon, "Attach a coupon code to a pending order.", {"order_id": ID, "code": S}),
]


class Orders(ToolFamily):
    name = "orders"
    description = "shop order desk tools: find customers and products, edit and cancel orders with stock (end state checked)"

    def fill(self, s: Store, rng: random.Random, customers: int, products: int) -> None:
        names = people(rng, customers)
        s.add("customers", "id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL, city TEXT NOT NULL",
              [[i, n, email(n, rng.randint(1, 99)), rng.choice(CITIES)] for i, n in enumerate(names, 1)])
        titles = rng.sample([f"{a} {n}" for a in ADJ for n in NOUN], products)
        skus = rng.sample(range(1000, 10000), products)
        s.add("products", "sku TEXT PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL, "
                          "stock INTEGER NOT NULL, discontinued INTEGER NOT NULL",
              [[f"SKU-{k}", n, rng.randint(3, 90) * 100 + 99, rng.randint(8, 60), int(rng.random() < 0.2)]
               for k, n in zip(skus, titles)])
        s.add("orders", "id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), "
                        "status TEXT NOT NULL, placed TEXT NOT NULL, coupon TEXT")
        s.add("order_lines", "id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id), "
                             "sku TEXT NOT NULL REFERENCES products(sku), qty INTEGER NOT NULL")
        s.add("refunds", "id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL, amount_cents INTEGER NOT NULL")
        for c in self.records_per_owner(rng, customers):
            Orders._order(s, rng, c, rng.choices(["pending", "shipped", "delivered", "cancelled"], [2, 3, 4, 1])[0],
                          rng.sample(s["products"].rows, rng.randint(1, 3)))

    @staticmethod
    def _order(s: Store, rng: random.Random, customer: int, status: str, products: list[list], qty=None) -> int:
        oid = 5001 + len(s["orders"].rows)
        s["orders"].rows.append([oid, customer, status, f"2026-{rng.randint(1, 5):02d}-{rng.randint(1, 28):02d}", None])
        for p in products:
            s["order_lines"].rows.append([len(s["order_lines"].rows) + 1, oid, p[0], qty or rng.randint(1, 4)])
        return oid

    @staticmethod
    def _lines(s: Store, oid: int) -> list[list]:
        return [line for line in s["order_lines"].rows if line[1] == oid]

    @staticmethod
    def _pending_of(s: Store, customer: int) -> list[int]:
        return [o[0] for o in s["orders"].rows if o[1] == customer and o[2] == "pending"]

    # -- scenarios (None: not possible on this store) --------------------------------------------
    def _cancel(self, rng: random.Random, s: Store):
        pending = [o for o in s["orders"].rows if o[2] == "pending"]
        if not pending:
            return None
        order = rng.choice(pending)
        name = s["customers"].by_key()[order[1]][1]
        products, lines = s["products"], self._lines(s, order[0])
        text = (f"Order {order[0]} from {name} is still pending, and {name.split()[0]} has asked us to cancel it. "
                "Please take care of it, and don't change anything else.")
        oracle = [call("get_order", order_id=order[0]), call("cancel_order", order_id=order[0])]
        want = [after(s["orders"], order[0], status="cancelled")]
        want += [after(products, sku, stock=products.by_key()[sku][3] + qty) for _, _, sku, qty in lines]
        return Scenario(text, oracle, want, {"orders": [order[0]], "products": [line[2] for line in lines]})

    def _swap(self, rng: random.Random, s: Store):
        customer = rng.randint(1, len(s["customers"].rows))
        name = s["customers"].by_key()[customer][1]
        for oid in self._pending_of(s, customer):  # one pending order only
            s["orders"].by_key()[oid][2] = "delivered"
        products = s["products"]
        old = rng.choice(products.rows)
        oid = self._order(s, rng, customer, "pending", [old] + rng.sample([p for p in products.rows if p is not old], 1))
        in_order = {line[2] for line in self._lines(s, oid)}
        candidates = [p for p in products.rows if p[0] not in in_order and not p[4] and p[3] >= 5
                      and sum(p[1].lower() in q[1].lower() for q in products.rows) == 1]
        if not candidates:
            return None
        new, qty = rng.choice(candidates), rng.randint(2, 4)
        line = next(ln for ln in self._lines(s, oid) if ln[2] == old[0])
        text = (f"Hi, it's {name}. In my order that hasn't shipped yet, please replace the {old[1]} with {qty} of "
                f"the {new[1]}. Everything else in the order is fine, and please leave my other orders alone.")
        oracle = [call("find_customer", text=name), call("list_orders", customer_id=customer, status="pending"),
                  call("get_order", order_id=oid), call("search_products", text=new[1]),
                  call("remove_item", order_id=oid, sku=old[0]), call("add_item", order_id=oid, sku=new[0], qty=qty)]
        want = [after(s["order_lines"], line[0], deleted=True), after(products, old[0], stock=old[3] + line[3]),
                after(products, new[0], stock=new[3] - qty)]
        return Scenario(text, oracle, want, {"order_lines": [line[0]], "products": [old[0], new[0]]},
                        added=[["order_lines", {"order_id": oid, "sku": new[0], "qty": qty}]])

    def _trim(self, rng: random.Random, s: Store):
        customers, products = s["customers"], s["products"]
        target, twin = customers.namesake(rng, city=CITIES)
        _, name, _, city = customers.by_key()[target]
        for c in (target, twin):
            for oid in self._pending_of(s, c):
                s["orders"].by_key()[oid][2] = "shipped"
        live = [p for p in products.rows if not p[4]]
        dead = [p for p in products.rows if p[4]]
        if len(live) < 4 or not dead:
            return None
        raise_p, *others = rng.sample(live, rng.randint(2, 3) + 1)
        gone = rng.choice(dead)
        items = [raise_p, *others, gone]
        rng.shuffle(items)
        oid = self._order(s, rng, target, "pending", items, qty=1)
        self._order(s, rng, twin, "pending", [raise_p, gone], qty=1)  # the other customer's order looks alike
        qty = rng.randint(3, 5)
        if raise_p[3] < qty:
            return None
        lines = {ln[2]: ln for ln in self._lines(s, oid)}
        text = (f"Hello, this is {name} from {city}. In my open order, I'd like {qty} of the {raise_p[1]} in total, "
                "and please take out anything in that order that has been discontinued: I'd rather not wait for it. "
                "Leave the rest of the order as it is.")
        oracle = [call("find_customer", text=name), call("list_orders", customer_id=target, status="pending"),
                  call("get_order", order_id=oid)]
        oracle += [call("get_product", sku=p[0]) for p in items if p is not raise_p]
        oracle += [call("set_quantity", order_id=oid, sku=raise_p[0], qty=qty),
                   call("remove_item", order_id=oid, sku=gone[0])]
        want = [after(s["order_lines"], lines[raise_p[0]][0], qty=qty),
                after(s["order_lines"], lines[gone[0]][0], deleted=True),
                after(products, raise_p[0], stock=raise_p[3] - (qty - 1)), after(products, gone[0], stock=gone[3] + 1)]
        return Scenario(text, oracle, want, {"order_lines": [lines[raise_p[0]][0], lines[gone[0]][0]],
                                             "products": [raise_p[0], gone[0]]})

    # -- what each level offers: the store's size (its knobs), the scenario, the tools and their helpers
    domain, library, helpers = "a shop's order desk", LIBRARY, DOMAIN_HELPERS
    sizes = {1: {"customers": 6, "products": 10}, 2: {"customers": 12, "products": 16},
             3: {"customers": 18, "products": 22}}
    scenarios = ("_cancel", "_swap", "_trim")
