"""The code of the support help desk (tasks/envs/families/tickets.py)
that runs inside the sandbox as `.tools/tools.py`: its helpers (from `_ticket` to `_live`) and
one function per tool, shipped by their source text (see `tool_code`). Standard library only."""

from ...tools.server import ToolError
from .common import _dicts, _like, _one, _set


def _ticket(db, ticket_id):
    return _one(db, "SELECT t.id, t.customer_id, c.name AS customer, c.company, t.subject, t.status, t.priority, "
                "t.assignee_id, a.name AS assignee, t.created, t.merged_into FROM tickets t JOIN customers c ON "
                "c.id = t.customer_id LEFT JOIN agents a ON a.id = t.assignee_id WHERE t.id = ?", (ticket_id,),
                f"no ticket {ticket_id}")


def _live(db, ticket_id):
    t = _ticket(db, ticket_id)
    if t["status"] in ("closed", "merged"):
        raise ToolError(f"ticket {ticket_id} is {t['status']}")
    return t


def search_customers(db, text):
    return _like(db, "SELECT id, name, company, email FROM customers WHERE lower(name) LIKE ? OR lower(company) "
                 "LIKE ? OR lower(email) LIKE ? ORDER BY id", text, f"no customer matches {text!r}")


def list_tickets(db, customer_id=None, status=None):
    if customer_id is None and status is None:
        raise ToolError("give customer_id and/or status")
    return _dicts(db.execute("SELECT id, subject, status, priority, created FROM tickets WHERE "
                             "(? IS NULL OR customer_id = ?) AND (? IS NULL OR status = ?) ORDER BY created, id",
                             (customer_id, customer_id, status, status)))


def get_ticket(db, ticket_id):
    t = _ticket(db, ticket_id)
    t["comments"] = _dicts(db.execute("SELECT author, body FROM comments WHERE ticket_id = ? ORDER BY id",
                                      (ticket_id,)))
    return t


def list_agents(db, team=None):
    return _dicts(db.execute("SELECT a.id, a.name, a.team, (SELECT COUNT(*) FROM tickets t WHERE t.assignee_id "
                             "= a.id AND t.status IN ('open', 'pending')) AS open_tickets FROM agents a WHERE "
                             "? IS NULL OR a.team = ? ORDER BY a.id", (team, team)))


def assign_ticket(db, ticket_id, agent_id):
    _live(db, ticket_id)
    _one(db, "SELECT id FROM agents WHERE id = ?", (agent_id,), f"no agent {agent_id}")
    db.execute("UPDATE tickets SET assignee_id = ? WHERE id = ?", (agent_id, ticket_id))
    return _ticket(db, ticket_id)


def set_priority(db, ticket_id, priority):
    return _set(db, _live, ticket_id, "UPDATE tickets SET priority = ? WHERE id = ?", priority, ticket_id)


def set_status(db, ticket_id, status):
    t = _ticket(db, ticket_id)
    if t["status"] == "merged":
        raise ToolError(f"ticket {ticket_id} was merged into {t['merged_into']}")
    if t["status"] == status:
        raise ToolError(f"ticket {ticket_id} is already {status}")
    db.execute("UPDATE tickets SET status = ? WHERE id = ?", (status, ticket_id))
    return _ticket(db, ticket_id)


def add_comment(db, ticket_id, body):
    _ticket(db, ticket_id)
    cur = db.execute("INSERT INTO comments (ticket_id, author, body) VALUES (?, 'support', ?)", (ticket_id, body))
    return {"comment": cur.lastrowid, "ticket_id": ticket_id}


def merge_tickets(db, source_id, target_id):
    if source_id == target_id:
        raise ToolError("a ticket cannot be merged into itself")
    src, dst = _live(db, source_id), _live(db, target_id)
    if src["customer_id"] != dst["customer_id"]:
        raise ToolError(f"tickets {source_id} and {target_id} belong to different customers")
    db.execute("UPDATE tickets SET status = 'merged', merged_into = ? WHERE id = ?", (target_id, source_id))
    return _ticket(db, source_id)


def get_sla_policy(db, priority):
    hours = {"low": (48, 240), "normal": (24, 120), "high": (8, 48), "urgent": (1, 12)}[priority]
    return {"priority": priority, "first_response_hours": hours[0], "resolution_hours": hours[1]}


def list_macros(db):
    return [{"name": "ack", "text": "Thanks for reaching out, we are looking into it."},
            {"name": "resolved", "text": "This should be fixed now, please let us know if not."}]


def escalate_to_engineering(db, ticket_id, summary):
    _live(db, ticket_id)
    cur = db.execute("INSERT INTO escalations (ticket_id, summary) VALUES (?, ?)", (ticket_id, summary))
    return {"escalation": cur.lastrowid}


def create_ticket(db, customer_id, subject):
    _one(db, "SELECT id FROM customers WHERE id = ?", (customer_id,), f"no customer {customer_id}")
    cur = db.execute("INSERT INTO tickets (id, customer_id, subject, status, priority, assignee_id, created, "
                     "merged_into) VALUES ((SELECT MAX(id) + 1 FROM tickets), ?, ?, 'open', 'normal', NULL, "
                     "'2026-06-01 09:00', NULL)", (customer_id, subject))
    return _ticket(db, cur.lastrowid)


def ticket_stats(db):
    return _dicts(db.execute("SELECT status, COUNT(*) AS tickets FROM tickets GROUP BY status ORDER BY status"))
