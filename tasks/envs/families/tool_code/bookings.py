"""The code of the hotel booking desk (tasks/envs/families/bookings.py)
that runs inside the sandbox as `.tools/tools.py`: its helpers (from `ROOM_TYPES` to `_booking`) and
one function per tool, shipped by their source text (see `tool_code`). Standard library only."""

import datetime as _dt

from ...tools.server import ToolError
from .common import _cancel, _date, _dicts, _like, _one

ROOM_TYPES = ("standard", "deluxe", "suite")


def _busy(db, room, start, nights, ignore=None):
    """The id of a confirmed booking of `room` overlapping [start, start + nights), else None."""
    end = start + _dt.timedelta(days=nights)
    for b in db.execute("SELECT id, check_in, nights FROM bookings WHERE room = ? AND status = 'confirmed'", (room,)):
        s = _dt.date.fromisoformat(b["check_in"])
        if b["id"] != ignore and s < end and start < s + _dt.timedelta(days=b["nights"]):
            return b["id"]
    return None


def _booking(db, booking_id):
    return _one(db, "SELECT b.id, b.guest_id, g.name AS guest, b.room, r.type AS room_type, b.check_in, b.nights, "
                "b.status FROM bookings b JOIN guests g ON g.id = b.guest_id JOIN rooms r ON r.number = b.room "
                "WHERE b.id = ?", (booking_id,), f"no booking {booking_id}")


def find_guest(db, name):
    return _like(db, "SELECT id, name, email, phone FROM guests WHERE lower(name) LIKE ? ORDER BY id", name,
                 f"no guest whose name contains {name!r}")


def list_bookings(db, guest_id):
    _one(db, "SELECT id FROM guests WHERE id = ?", (guest_id,), f"no guest {guest_id}")
    return _dicts(db.execute("SELECT b.id, b.room, r.type AS room_type, b.check_in, b.nights, b.status "
                             "FROM bookings b JOIN rooms r ON r.number = b.room WHERE b.guest_id = ? "
                             "ORDER BY b.check_in, b.id", (guest_id,)))


def get_booking(db, booking_id):
    return _booking(db, booking_id)


def search_rooms(db, check_in, nights, room_type=None):
    start = _date(check_in, "check_in")
    rooms = db.execute("SELECT number, type, rate_cents, floor FROM rooms ORDER BY number").fetchall()
    return [dict(r) for r in rooms if room_type in (None, r["type"]) and _busy(db, r["number"], start, nights) is None]


def update_booking(db, booking_id, room=None, check_in=None, nights=None):
    b = _booking(db, booking_id)
    if b["status"] != "confirmed":
        raise ToolError(f"booking {booking_id} is {b['status']}; only confirmed bookings can change")
    if room is None and check_in is None and nights is None:
        raise ToolError("nothing to change: give room, check_in and/or nights")
    room = b["room"] if room is None else room
    _one(db, "SELECT number FROM rooms WHERE number = ?", (room,), f"no room {room}")
    start = _date(check_in, "check_in") if check_in else _dt.date.fromisoformat(b["check_in"])
    nights = b["nights"] if nights is None else nights
    if _busy(db, room, start, nights, ignore=booking_id) is not None:
        raise ToolError(f"room {room} is not free for {nights} nights from {start}")
    db.execute("UPDATE bookings SET room = ?, check_in = ?, nights = ? WHERE id = ?",
               (room, start.isoformat(), nights, booking_id))
    return _booking(db, booking_id)


def cancel_booking(db, booking_id):
    return _cancel(db, "bookings", _booking(db, booking_id), "booking")


def create_booking(db, guest_id, room, check_in, nights):
    _one(db, "SELECT id FROM guests WHERE id = ?", (guest_id,), f"no guest {guest_id}")
    _one(db, "SELECT number FROM rooms WHERE number = ?", (room,), f"no room {room}")
    start = _date(check_in, "check_in")
    if _busy(db, room, start, nights) is not None:
        raise ToolError(f"room {room} is not free for {nights} nights from {start}")
    cur = db.execute("INSERT INTO bookings (id, guest_id, room, check_in, nights, status) VALUES "
                     "((SELECT MAX(id) + 1 FROM bookings), ?, ?, ?, ?, 'confirmed')",
                     (guest_id, room, start.isoformat(), nights))
    return _booking(db, cur.lastrowid)


def get_rate_card(db):
    return _dicts(db.execute("SELECT type, MIN(rate_cents) AS lowest, MAX(rate_cents) AS highest FROM rooms "
                             "GROUP BY type ORDER BY type"))


def hotel_policies(db):
    return {"check_in": "from 15:00", "check_out": "until 11:00",
            "cancellation": "free until the day before arrival"}


def update_guest_contact(db, guest_id, email=None, phone=None):
    _one(db, "SELECT id FROM guests WHERE id = ?", (guest_id,), f"no guest {guest_id}")
    if email is None and phone is None:
        raise ToolError("give email and/or phone")
    if email is not None and "@" not in email:
        raise ToolError(f"not an e-mail address: {email!r}")
    db.execute("UPDATE guests SET email = COALESCE(?, email), phone = COALESCE(?, phone) WHERE id = ?",
               (email, phone, guest_id))
    return _one(db, "SELECT id, name, email, phone FROM guests WHERE id = ?", (guest_id,), "gone")


def add_loyalty_points(db, guest_id, points):
    _one(db, "SELECT id FROM guests WHERE id = ?", (guest_id,), f"no guest {guest_id}")
    db.execute("UPDATE guests SET points = points + ? WHERE id = ?", (points, guest_id))
    return _one(db, "SELECT id, points FROM guests WHERE id = ?", (guest_id,), "gone")


def request_housekeeping(db, room, note):
    _one(db, "SELECT number FROM rooms WHERE number = ?", (room,), f"no room {room}")
    cur = db.execute("INSERT INTO housekeeping (room, note) VALUES (?, ?)", (room, note))
    return {"request": cur.lastrowid, "room": room}


def list_arrivals(db, date):
    day = _date(date)
    return _dicts(db.execute("SELECT b.id, g.name AS guest, b.room, b.nights FROM bookings b JOIN guests g "
                             "ON g.id = b.guest_id WHERE b.check_in = ? AND b.status = 'confirmed' ORDER BY b.id",
                             (day.isoformat(),)))
