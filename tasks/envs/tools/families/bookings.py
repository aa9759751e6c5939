"""A hotel front desk: guests, rooms and bookings behind lookup, booking and (distractor) desk tools.

Knobs by level (see `common`): level 1 cancels a booking named by its number (2 calls, 1 distractor
tool); level 2 moves a guest, named by name only, to the cheapest free room of another type for the
same nights (name -> guest id -> booking -> free rooms: 4 calls, 3 distractors); level 3 extends a
stay whose room is taken on the extra nights (the whole stay moves to the cheapest free room of the
same type) and cancels the guest's other booking, while another guest has the same name and a stay
on the same day (the e-mail disambiguates; 5 calls, 6 distractors). Expected rows are computed here
in Python from the generated bookings.
"""

from __future__ import annotations

import datetime as dt
import random

from ..family import ToolFamily
from ..spec import ToolTask
from .common import DATE, ID, S, Scenario, Store, after, call, email, make_task, people, tool

TYPES = {"standard": 9000, "deluxe": 14000, "suite": 24000}
START = dt.date(2026, 3, 1)
NIGHTS = {"type": "integer", "minimum": 1, "maximum": 21}

DOMAIN_HELPERS = '''
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
'''

LIBRARY = [
    tool("find_guest", "Find guests whose name contains the given text (case-insensitive); returns id, name, "
         "email and phone of each.", '''
        def find_guest(db, name):
            found = _dicts(db.execute("SELECT id, name, email, phone FROM guests WHERE lower(name) LIKE ? ORDER BY id",
                                      (f"%{name.strip().lower()}%",)))
            if not found:
                raise ToolError(f"no guest whose name contains {name!r}")
            return found''', {"name": {"type": "string", "minLength": 2}}),
    tool("list_bookings", "List a guest's bookings (any status), by check-in date.", '''
        def list_bookings(db, guest_id):
            _one(db, "SELECT id FROM guests WHERE id = ?", (guest_id,), f"no guest {guest_id}")
            return _dicts(db.execute("SELECT b.id, b.room, r.type AS room_type, b.check_in, b.nights, b.status "
                                     "FROM bookings b JOIN rooms r ON r.number = b.room WHERE b.guest_id = ? "
                                     "ORDER BY b.check_in, b.id", (guest_id,)))''', {"guest_id": ID}),
    tool("get_booking", "Show one booking: guest, room, room type, check-in date, nights, status.", '''
        def get_booking(db, booking_id):
            return _booking(db, booking_id)''', {"booking_id": ID}),
    tool("search_rooms", "Rooms free for every night from check_in for the given number of nights, optionally of "
         "one type, with their nightly rate in cents.", '''
        def search_rooms(db, check_in, nights, room_type=None):
            start = _date(check_in, "check_in")
            rooms = db.execute("SELECT number, type, rate_cents, floor FROM rooms ORDER BY number").fetchall()
            return [dict(r) for r in rooms if room_type in (None, r["type"]) and _busy(db, r["number"], start, nights) is None]''',
         {"check_in": DATE, "nights": NIGHTS, "room_type": {"type": "string", "enum": list(TYPES)}},
         ["check_in", "nights"]),
    tool("update_booking", "Change a confirmed booking's room, check-in date and/or number of nights; the room "
         "must be free for the whole new stay.", '''
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
            return _booking(db, booking_id)''',
         {"booking_id": ID, "room": ID, "check_in": DATE, "nights": NIGHTS}, ["booking_id"]),
    tool("cancel_booking", "Cancel a confirmed booking.", '''
        def cancel_booking(db, booking_id):
            b = _booking(db, booking_id)
            if b["status"] != "confirmed":
                raise ToolError(f"booking {booking_id} is already {b['status']}")
            db.execute("UPDATE bookings SET status = 'cancelled' WHERE id = ?", (booking_id,))
            return {"id": booking_id, "status": "cancelled"}''', {"booking_id": ID}),
    tool("create_booking", "Book a room for a guest; the room must be free for every night.", '''
        def create_booking(db, guest_id, room, check_in, nights):
            _one(db, "SELECT id FROM guests WHERE id = ?", (guest_id,), f"no guest {guest_id}")
            _one(db, "SELECT number FROM rooms WHERE number = ?", (room,), f"no room {room}")
            start = _date(check_in, "check_in")
            if _busy(db, room, start, nights) is not None:
                raise ToolError(f"room {room} is not free for {nights} nights from {start}")
            cur = db.execute("INSERT INTO bookings (id, guest_id, room, check_in, nights, status) VALUES "
                             "((SELECT MAX(id) + 1 FROM bookings), ?, ?, ?, ?, 'confirmed')",
                             (guest_id, room, start.isoformat(), nights))
            return _booking(db, cur.lastrowid)''', {"guest_id": ID, "room": ID, "check_in": DATE, "nights": NIGHTS}),
    tool("get_rate_card", "The hotel's nightly rates per room type (lowest and highest, in cents).", '''
        def get_rate_card(db):
            return _dicts(db.execute("SELECT type, MIN(rate_cents) AS lowest, MAX(rate_cents) AS highest FROM rooms "
                                     "GROUP BY type ORDER BY type"))'''),
    tool("hotel_policies", "The hotel's check-in, check-out and cancellation policies.", '''
        def hotel_policies(db):
            return {"check_in": "from 15:00", "check_out": "until 11:00",
                    "cancellation": "free until the day before arrival"}'''),
    tool("update_guest_contact", "Change a guest's e-mail address and/or phone number.", '''
        def update_guest_contact(db, guest_id, email=None, phone=None):
            _one(db, "SELECT id FROM guests WHERE id = ?", (guest_id,), f"no guest {guest_id}")
            if email is None and phone is None:
                raise ToolError("give email and/or phone")
            if email is not None and "@" not in email:
                raise ToolError(f"not an e-mail address: {email!r}")
            db.execute("UPDATE guests SET email = COALESCE(?, email), phone = COALESCE(?, phone) WHERE id = ?",
                       (email, phone, guest_id))
            return _one(db, "SELECT id, name, email, phone FROM guests WHERE id = ?", (guest_id,), "gone")''',
         {"guest_id": ID, "email": S, "phone": S}, ["guest_id"]),
    tool("add_loyalty_points", "Credit loyalty points to a guest's account.", '''
        def add_loyalty_points(db, guest_id, points):
            _one(db, "SELECT id FROM guests WHERE id = ?", (guest_id,), f"no guest {guest_id}")
            db.execute("UPDATE guests SET points = points + ? WHERE id = ?", (points, guest_id))
            return _one(db, "SELECT id, points FROM guests WHERE id = ?", (guest_id,), "gone")''',
         {"guest_id": ID, "points": {"type": "integer", "minimum": 1, "maximum": 10000}}),
    tool("request_housekeeping", "Ask housekeeping to service a room, with a note.", '''
        def request_housekeeping(db, room, note):
            _one(db, "SELECT number FROM rooms WHERE number = ?", (room,), f"no room {room}")
            cur = db.execute("INSERT INTO housekeeping (room, note) VALUES (?, ?)", (room, note))
            return {"request": cur.lastrowid, "room": room}''', {"room": ID, "note": S}),
    tool("list_arrivals", "Confirmed bookings checking in on a date.", '''
        def list_arrivals(db, date):
            day = _date(date)
            return _dicts(db.execute("SELECT b.id, g.name AS guest, b.room, b.nights FROM bookings b JOIN guests g "
                                     "ON g.id = b.guest_id WHERE b.check_in = ? AND b.status = 'confirmed' ORDER BY b.id",
                                     (day.isoformat(),)))''', {"date": DATE}),
]


def _day(d: dt.date) -> str:
    return d.isoformat()


def _nice(d: str) -> str:
    day = dt.date.fromisoformat(d)
    return f"{day:%A} {day:%B} {day.day}"


class Bookings(ToolFamily):
    name = "bookings"
    description = "hotel front desk tools: find guests, search rooms, change and cancel bookings (end state checked)"

    def task(self, level: int, rng: random.Random) -> ToolTask:
        n_guests, n_rooms = {1: (8, 9), 2: (14, 12), 3: (20, 15)}[level]
        while True:  # regenerate until the scenario exists (deterministic in rng)
            store = self._store(rng, n_guests, n_rooms)
            made = (self._cancel, self._upgrade, self._extend)[level - 1](rng, store)
            if made is not None:
                break
        return make_task(level, rng, "a hotel front desk", store, made, LIBRARY, DOMAIN_HELPERS,
                         guests=n_guests, rooms=n_rooms)

    # -- data ------------------------------------------------------------------------------------
    @staticmethod
    def _store(rng: random.Random, n_guests: int, n_rooms: int) -> Store:
        s = Store()
        types = [list(TYPES)[i % 3] for i in range(n_rooms)]
        rng.shuffle(types)
        rates = rng.sample(range(0, 60), n_rooms)
        s.add("rooms", [("number", "INTEGER PRIMARY KEY"), ("type", "TEXT NOT NULL"), ("rate_cents", "INTEGER NOT NULL"),
                        ("floor", "INTEGER NOT NULL")],
              [[100 * (1 + i // 6) + 1 + i % 6, t, TYPES[t] + 100 * r, 1 + i // 6]
               for i, (t, r) in enumerate(zip(types, rates))])
        names = people(rng, n_guests)
        s.add("guests", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("email", "TEXT NOT NULL"),
                         ("phone", "TEXT NOT NULL"), ("points", "INTEGER NOT NULL DEFAULT 0")],
              [[i, n, email(n, rng.randint(1, 99)), f"+1-555-{rng.randint(1000, 9999)}", rng.randint(0, 40) * 50]
               for i, n in enumerate(names, 1)])
        s.add("bookings", [("id", "INTEGER PRIMARY KEY"), ("guest_id", "INTEGER NOT NULL REFERENCES guests(id)"),
                           ("room", "INTEGER NOT NULL REFERENCES rooms(number)"), ("check_in", "TEXT NOT NULL"),
                           ("nights", "INTEGER NOT NULL"), ("status", "TEXT NOT NULL")])
        s.add("housekeeping", [("id", "INTEGER PRIMARY KEY"), ("room", "INTEGER NOT NULL"), ("note", "TEXT NOT NULL")])
        rooms = [r[0] for r in s["rooms"].rows]
        for g in range(1, n_guests + 1):
            for _ in range(rng.randint(1, 3)):
                Bookings._book(s, g, rng.choice(rooms), START + dt.timedelta(days=rng.randint(0, 50)),
                               rng.randint(1, 5), "cancelled" if rng.random() < 0.15 else "confirmed")
        return s

    @staticmethod
    def _free(s: Store, room: int, start: dt.date, nights: int, ignore: int | None = None) -> bool:
        end = start + dt.timedelta(days=nights)
        for b in s["bookings"].dicts():
            b_in = dt.date.fromisoformat(b["check_in"])
            if (b["room"] == room and b["status"] == "confirmed" and b["id"] != ignore
                    and b_in < end and start < b_in + dt.timedelta(days=b["nights"])):
                return False
        return True

    @staticmethod
    def _book(s: Store, guest: int, room: int, start: dt.date, nights: int, status: str = "confirmed") -> int | None:
        if status == "confirmed" and not Bookings._free(s, room, start, nights):
            return None
        bid = 1001 + len(s["bookings"].rows)
        s["bookings"].rows.append([bid, guest, room, _day(start), nights, status])
        return bid

    @staticmethod
    def _room_types(s: Store) -> dict[int, str]:
        return {r[0]: r[1] for r in s["rooms"].rows}

    def _cheapest_free(self, s: Store, room_type: str, start: dt.date, nights: int, ignore: int) -> list[int]:
        rooms = sorted((r[2], r[0]) for r in s["rooms"].rows if r[1] == room_type)
        return [n for _, n in rooms if self._free(s, n, start, nights, ignore)]

    # -- scenarios (None: not possible on this store) --------------------------------------------
    def _cancel(self, rng: random.Random, s: Store):
        b = rng.choice([b for b in s["bookings"].dicts() if b["status"] == "confirmed"])
        guest = s["guests"].by_key()[b["guest_id"]][1]
        text = (f"Please cancel booking {b['id']} ({guest}, arriving {_nice(b['check_in'])}): the guest can't make "
                "the trip. Don't change anything else.")
        oracle = [call("get_booking", booking_id=b["id"]), call("cancel_booking", booking_id=b["id"])]
        return Scenario(text, oracle, [after(s["bookings"], b["id"], status="cancelled")], {"bookings": [b["id"]]})

    def _upgrade(self, rng: random.Random, s: Store):
        counts: dict[str, int] = {}
        for g in s["guests"].rows:
            counts[g[1]] = counts.get(g[1], 0) + 1
        types = self._room_types(s)
        options = []
        for b in s["bookings"].dicts():
            starts = [x["check_in"] for x in s["bookings"].dicts() if x["guest_id"] == b["guest_id"]]
            if b["status"] != "confirmed" or starts.count(b["check_in"]) > 1:
                continue
            for t in sorted(TYPES):
                free = self._cheapest_free(s, t, dt.date.fromisoformat(b["check_in"]), b["nights"], b["id"])
                if t != types[b["room"]] and len(free) >= 2:
                    options.append((b, t, free[0]))
        if not options:
            return None
        b, t, room = rng.choice(options)
        guest = s["guests"].by_key()[b["guest_id"]]
        text = (f"Hi, this is {guest[1]}. For my stay that starts on {_nice(b['check_in'])}, could you put me in a "
                f"{t} room instead? Whichever {t} room is cheapest and free for all my nights; the dates stay the "
                "same. Please don't change anything else.")
        oracle = [call("find_guest", name=guest[1]), call("list_bookings", guest_id=guest[0]),
                  call("search_rooms", check_in=b["check_in"], nights=b["nights"], room_type=t),
                  call("update_booking", booking_id=b["id"], room=room)]
        return Scenario(text, oracle, [after(s["bookings"], b["id"], room=room)], {"bookings": [b["id"]]})

    def _extend(self, rng: random.Random, s: Store):
        guests = s["guests"]
        target, twin = rng.sample(range(1, len(guests.rows) + 1), 2)
        name, mail = guests.by_key()[target][1], guests.by_key()[target][2]
        guests.by_key()[twin][1:3] = [name, email(name, rng.randint(100, 199))]  # same name, another e-mail
        types, extra = self._room_types(s), rng.randint(1, 3)
        rooms = sorted(types)
        stay_start = START + dt.timedelta(days=rng.randint(0, 30))
        room, nights = rng.choice(rooms), rng.randint(2, 4)
        stay = self._book(s, target, room, stay_start, nights)
        end = stay_start + dt.timedelta(days=nights)
        blocker = self._book(s, rng.choice([g for g in range(1, len(guests.rows) + 1) if g not in (target, twin)]),
                             room, end + dt.timedelta(days=rng.randint(0, extra - 1)), rng.randint(1, 3))
        other_start = end + dt.timedelta(days=rng.randint(5, 15))
        other = self._book(s, target, rng.choice(rooms), other_start, rng.randint(1, 3))
        decoy = self._book(s, twin, rng.choice(rooms), stay_start, rng.randint(2, 4))
        if None in (stay, blocker, other, decoy) or any(
                b[1] == target and b[0] not in (stay, other) and b[5] == "confirmed" for b in s["bookings"].rows):
            return None  # the guest must have exactly these two confirmed bookings
        free = self._cheapest_free(s, types[room], stay_start, nights + extra, stay)
        if not free:
            return None
        text = (f"Hi, {name} here ({mail}). Please extend my stay that starts on {_nice(_day(stay_start))} by {extra} "
                f"night{'s' if extra > 1 else ''}. Keep my room if it is free for the extra nights; otherwise move the "
                f"whole stay to the cheapest room of the same type that is free for all of it. I also won't need my "
                f"booking from {_nice(_day(other_start))} any more, please cancel it. Nothing else should change.")
        oracle = [call("find_guest", name=name), call("list_bookings", guest_id=target),
                  call("search_rooms", check_in=_day(stay_start), nights=nights + extra, room_type=types[room]),
                  call("update_booking", booking_id=stay, room=free[0], nights=nights + extra),
                  call("cancel_booking", booking_id=other)]
        want = [after(s["bookings"], stay, room=free[0], nights=nights + extra),
                after(s["bookings"], other, status="cancelled")]
        return Scenario(text, oracle, want, {"bookings": [stay, other]})
