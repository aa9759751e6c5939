"""The code of the personal calendar (tasks/envs/families/calendar.py)
that runs inside the sandbox as `.tools/tools.py`: its helpers (from `OPEN` to `_conflict`) and
one function per tool, shipped by their source text (see `tool_code`). Standard library only."""

import datetime as _dt

from ...tools.server import ToolError
from .common import _cancel, _date, _dicts, _like, _one, _set

OPEN, CLOSE = 8 * 60, 18 * 60


def _when(text):
    try:
        return _dt.datetime.strptime(text, "%Y-%m-%d %H:%M")
    except ValueError:
        raise ToolError(f"times are 'YYYY-MM-DD HH:MM', got {text!r}") from None


def _clock(text, what):
    try:
        t = _dt.datetime.strptime(text, "%H:%M")
    except ValueError:
        raise ToolError(f"{what} must be HH:MM, got {text!r}") from None
    return t.hour * 60 + t.minute


def _event(db, event_id):
    return _one(db, "SELECT id, title, start, minutes, location, status FROM events WHERE id = ?", (event_id,),
                f"no event {event_id}")


def _conflict(db, day, begin, end, ignore=None):
    for e in db.execute("SELECT id, title, start, minutes FROM events WHERE status = 'confirmed' AND start LIKE ?",
                        (f"{day}%",)):
        s = _clock(e["start"][11:], "start")
        if e["id"] != ignore and s < end and begin < s + e["minutes"]:
            return e
    return None


def list_events(db, date):
    day = _date(date)
    return _dicts(db.execute("SELECT id, title, start, minutes, location FROM events WHERE status = "
                             "'confirmed' AND start LIKE ? ORDER BY start", (f"{day}%",)))


def search_events(db, text):
    return _dicts(db.execute("SELECT id, title, start, minutes FROM events WHERE status = 'confirmed' AND "
                             "lower(title) LIKE ? ORDER BY start", (f"%{text.strip().lower()}%",)))


def get_event(db, event_id):
    e = _event(db, event_id)
    e["attendees"] = _dicts(db.execute("SELECT a.email, c.name FROM attendees a LEFT JOIN contacts c ON "
                                       "c.email = a.email WHERE a.event_id = ? ORDER BY a.id", (event_id,)))
    return e


def find_free_slots(db, date, minutes, after="08:00", before="18:00"):
    day = _date(date)
    lo, hi = max(OPEN, _clock(after, "after")), min(CLOSE, _clock(before, "before"))
    lo += -lo % 30
    return [f"{day} {t // 60:02d}:{t % 60:02d}" for t in range(lo, hi - minutes + 1, 30)
            if _conflict(db, day, t, t + minutes) is None]


def move_event(db, event_id, start):
    e = _event(db, event_id)
    if e["status"] != "confirmed":
        raise ToolError(f"event {event_id} is {e['status']}")
    when = _when(start)
    begin = when.hour * 60 + when.minute
    if begin < OPEN or begin + e["minutes"] > CLOSE:
        raise ToolError("events must fit between 08:00 and 18:00")
    other = _conflict(db, when.date().isoformat(), begin, begin + e["minutes"], ignore=event_id)
    if other is not None:
        raise ToolError(f"that overlaps event {other['id']} ({other['title']} at {other['start']})")
    db.execute("UPDATE events SET start = ? WHERE id = ?", (start, event_id))
    return _event(db, event_id)


def cancel_event(db, event_id):
    return _cancel(db, "events", _event(db, event_id), "event")


def create_event(db, title, start, minutes):
    when = _when(start)
    begin = when.hour * 60 + when.minute
    other = _conflict(db, when.date().isoformat(), begin, begin + minutes)
    if other is not None:
        raise ToolError(f"that overlaps event {other['id']} ({other['title']} at {other['start']})")
    cur = db.execute("INSERT INTO events (title, start, minutes, location, status) VALUES (?, ?, ?, '', "
                     "'confirmed')", (title, start, minutes))
    return _event(db, cur.lastrowid)


def find_contact(db, name):
    return _like(db, "SELECT id, name, email FROM contacts WHERE lower(name) LIKE ? ORDER BY id", name,
                 f"no contact whose name contains {name!r}")


def add_attendee(db, event_id, email):
    _event(db, event_id)
    if "@" not in email:
        raise ToolError(f"not an e-mail address: {email!r}")
    if db.execute("SELECT 1 FROM attendees WHERE event_id = ? AND email = ?", (event_id, email)).fetchone():
        raise ToolError(f"{email} is already invited to event {event_id}")
    db.execute("INSERT INTO attendees (event_id, email) VALUES (?, ?)", (event_id, email))
    return {"event_id": event_id, "invited": email}


def remove_attendee(db, event_id, email):
    _event(db, event_id)
    if db.execute("DELETE FROM attendees WHERE event_id = ? AND email = ?", (event_id, email)).rowcount == 0:
        raise ToolError(f"{email} is not invited to event {event_id}")
    return {"event_id": event_id, "removed": email}


def rename_event(db, event_id, title):
    return _set(db, _event, event_id, "UPDATE events SET title = ? WHERE id = ?", title, event_id)


def set_reminder(db, event_id, minutes_before):
    _event(db, event_id)
    cur = db.execute("INSERT INTO reminders (event_id, minutes_before) VALUES (?, ?)", (event_id, minutes_before))
    return {"reminder": cur.lastrowid}


def share_calendar(db, email, role):
    cur = db.execute("INSERT INTO shares (email, role) VALUES (?, ?)", (email, role))
    return {"share": cur.lastrowid}


def get_weather(db, date):
    day = _date(date)
    return {"date": day.isoformat(), "forecast": ["sunny", "cloudy", "rain"][day.toordinal() % 3]}


def get_timezone(db):
    return {"timezone": "Europe/Lisbon"}
