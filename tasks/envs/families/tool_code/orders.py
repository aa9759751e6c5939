"""The code of the shop order desk (tasks/envs/families/orders.py)
that runs inside the sandbox as `.tools/tools.py`: its helpers (from `_order` to `_take`) and
one function per tool, shipped by their source text (see `tool_code`). Standard library only."""

from ...tools.server import ToolError
from .common import _dicts, _like, _one, _set


def _order(db, order_id):
    return _one(db, "SELECT id, customer_id, status, placed, coupon FROM orders WHERE id = ?", (order_id,),
                f"no order {order_id}")


def _pending(db, order_id):
    o = _order(db, order_id)
    if o["status"] != "pending":
        raise ToolError(f"order {order_id} is {o['status']}; only pending orders can change")
    return o


def _product(db, sku):
    return _one(db, "SELECT sku, name, price_cents, stock, discontinued FROM products WHERE sku = ?", (sku,),
                f"no product {sku!r} (skus look like SKU-1234)")


def _line(db, order_id, sku):
    return _one(db, "SELECT id, qty FROM order_lines WHERE order_id = ? AND sku = ?", (order_id, sku),
                f"order {order_id} has no line for {sku}")


def _take(db, sku, qty):
    p = _product(db, sku)
    if qty > 0 and p["discontinued"]:
        raise ToolError(f"{sku} ({p['name']}) is discontinued")
    if qty > p["stock"]:
        raise ToolError(f"only {p['stock']} of {sku} ({p['name']}) in stock, {qty} needed")
    db.execute("UPDATE products SET stock = stock - ? WHERE sku = ?", (qty, sku))


def find_customer(db, text):
    return _like(db, "SELECT id, name, email, city FROM customers WHERE lower(name) LIKE ? OR lower(email) LIKE ? "
                 "ORDER BY id", text, f"no customer matches {text!r}")


def list_orders(db, customer_id, status=None):
    _one(db, "SELECT id FROM customers WHERE id = ?", (customer_id,), f"no customer {customer_id}")
    return _dicts(db.execute("SELECT id, status, placed FROM orders WHERE customer_id = ? AND "
                             "(? IS NULL OR status = ?) ORDER BY placed DESC, id DESC",
                             (customer_id, status, status)))


def get_order(db, order_id):
    o = _order(db, order_id)
    o["lines"] = _dicts(db.execute("SELECT l.sku, p.name, l.qty, p.price_cents FROM order_lines l JOIN "
                                   "products p ON p.sku = l.sku WHERE l.order_id = ? ORDER BY l.id", (order_id,)))
    return o


def search_products(db, text):
    return _like(db, "SELECT sku, name, price_cents FROM products WHERE lower(name) LIKE ? ORDER BY sku", text,
                 f"no product name contains {text!r}")


def get_product(db, sku):
    p = _product(db, sku)
    p["discontinued"] = bool(p["discontinued"])
    return p


def set_quantity(db, order_id, sku, qty):
    _pending(db, order_id)
    line = _line(db, order_id, sku)
    _take(db, sku, qty - line["qty"])
    db.execute("UPDATE order_lines SET qty = ? WHERE id = ?", (qty, line["id"]))
    return {"order_id": order_id, "sku": sku, "qty": qty}


def add_item(db, order_id, sku, qty):
    _pending(db, order_id)
    if db.execute("SELECT 1 FROM order_lines WHERE order_id = ? AND sku = ?", (order_id, sku)).fetchone():
        raise ToolError(f"{sku} is already in order {order_id}; use set_quantity")
    _take(db, sku, qty)
    db.execute("INSERT INTO order_lines (order_id, sku, qty) VALUES (?, ?, ?)", (order_id, sku, qty))
    return {"order_id": order_id, "sku": sku, "qty": qty}


def remove_item(db, order_id, sku):
    _pending(db, order_id)
    line = _line(db, order_id, sku)
    db.execute("UPDATE products SET stock = stock + ? WHERE sku = ?", (line["qty"], sku))
    db.execute("DELETE FROM order_lines WHERE id = ?", (line["id"],))
    return {"order_id": order_id, "removed": sku}


def cancel_order(db, order_id):
    _pending(db, order_id)
    for line in db.execute("SELECT sku, qty FROM order_lines WHERE order_id = ?", (order_id,)).fetchall():
        db.execute("UPDATE products SET stock = stock + ? WHERE sku = ?", (line["qty"], line["sku"]))
    db.execute("UPDATE orders SET status = 'cancelled' WHERE id = ?", (order_id,))
    return {"order_id": order_id, "status": "cancelled"}


def get_shipping_quote(db, order_id):
    _order(db, order_id)
    n = db.execute("SELECT COALESCE(SUM(qty), 0) FROM order_lines WHERE order_id = ?", (order_id,)).fetchone()[0]
    return {"order_id": order_id, "cost_cents": 490 + 120 * n, "days": 2 + n // 4}


def issue_refund(db, order_id, amount_cents):
    o = _order(db, order_id)
    if o["status"] not in ("shipped", "delivered"):
        raise ToolError(f"order {order_id} is {o['status']}; only shipped or delivered orders are refunded")
    cur = db.execute("INSERT INTO refunds (order_id, amount_cents) VALUES (?, ?)", (order_id, amount_cents))
    return {"refund": cur.lastrowid}


def restock_product(db, sku, qty):
    return _set(db, _product, sku, "UPDATE products SET stock = stock + ? WHERE sku = ?", qty, sku)


def apply_coupon(db, order_id, code):
    return _set(db, _pending, order_id, "UPDATE orders SET coupon = ? WHERE id = ?", code, order_id)


def list_warehouses(db):
    return [{"code": "LIS-1", "city": "Lisbon"}, {"code": "GHE-2", "city": "Ghent"}]
