"""A personal calendar: one week of events, their attendees and a contact book behind lookup,
scheduling and (distractor) calendar tools.

Knobs by level (see `common`): level 1 cancels an event named by title and day (2 calls, 1 distractor
tool); level 2 moves an event to the first free slot of another day's afternoon (the slot has to be
found: 3 calls, 3 distractors); level 3 moves one of two same-titled events on a day (only its
attendees tell them apart) to the first free afternoon slot of another day, invites a contact named
by name, and cancels an event on a third day (9 calls, 6 distractors). The expected slot is computed
here in Python from the generated events (half-hour steps, working day 08:00-18:00).
"""

from __future__ import annotations

import datetime as dt
import random

from ..family import ToolFamily
from ..spec import ToolTask
from .common import DATE, ID, S, Scenario, Store, after, call, make_task, people, tool

MONDAYS = [dt.date(2026, 3, 2) + dt.timedelta(weeks=w) for w in range(16)]
TITLES = ["Dentist", "Team standup", "Budget review", "Design review", "Haircut", "Call with the bank", "Car service",
          "Gym", "Vet appointment", "Quarterly planning", "Interview", "Physio", "Parent-teacher meeting"]
PLACES = ["Room 4B", "Video call", "Downtown", "Main office", "Clinic", "Cafe Lindt"]
OPEN, CLOSE, NOON = 8 * 60, 18 * 60, 12 * 60
WHEN = {"type": "string", "minLength": 16, "maxLength": 16, "description": "YYYY-MM-DD HH:MM"}
HHMM = {"type": "string", "minLength": 5, "maxLength": 5, "description": "HH:MM"}
MINUTES = {"type": "integer", "minimum": 15, "maximum": 480}

DOMAIN_HELPERS = '''
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
'''

LIBRARY = [
    tool("list_events", "Confirmed events on a day: id, title, start, minutes, location.", '''
        def list_events(db, date):
            day = _date(date)
            return _dicts(db.execute("SELECT id, title, start, minutes, location FROM events WHERE status = "
                                     "'confirmed' AND start LIKE ? ORDER BY start", (f"{day}%",)))''', {"date": DATE}),
    tool("search_events", "Confirmed events whose title contains the text.", '''
        def search_events(db, text):
            return _dicts(db.execute("SELECT id, title, start, minutes FROM events WHERE status = 'confirmed' AND "
                                     "lower(title) LIKE ? ORDER BY start", (f"%{text.strip().lower()}%",)))''',
         {"text": {"type": "string", "minLength": 2}}),
    tool("get_event", "One event with its attendees (e-mail and, for contacts, name).", '''
        def get_event(db, event_id):
            e = _event(db, event_id)
            e["attendees"] = _dicts(db.execute("SELECT a.email, c.name FROM attendees a LEFT JOIN contacts c ON "
                                               "c.email = a.email WHERE a.event_id = ? ORDER BY a.id", (event_id,)))
            return e''', {"event_id": ID}),
    tool("find_free_slots", "Start times (half-hour steps) on a day when a meeting of the given length fits "
         "between no other events, within the working day 08:00-18:00 or between after/before.", '''
        def find_free_slots(db, date, minutes, after="08:00", before="18:00"):
            day = _date(date)
            lo, hi = max(OPEN, _clock(after, "after")), min(CLOSE, _clock(before, "before"))
            lo += -lo % 30
            return [f"{day} {t // 60:02d}:{t % 60:02d}" for t in range(lo, hi - minutes + 1, 30)
                    if _conflict(db, day, t, t + minutes) is None]''',
         {"date": DATE, "minutes": MINUTES, "after": HHMM, "before": HHMM}, ["date", "minutes"]),
    tool("move_event", "Move a confirmed event to a new start time (same length); it must not overlap another "
         "event and must fit in the working day.", '''
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
            return _event(db, event_id)''', {"event_id": ID, "start": WHEN}),
    tool("cancel_event", "Cancel a confirmed event.", '''
        def cancel_event(db, event_id):
            e = _event(db, event_id)
            if e["status"] != "confirmed":
                raise ToolError(f"event {event_id} is already {e['status']}")
            db.execute("UPDATE events SET status = 'cancelled' WHERE id = ?", (event_id,))
            return {"id": event_id, "status": "cancelled"}''', {"event_id": ID}),
    tool("create_event", "Create an event; it must not overlap another one.", '''
        def create_event(db, title, start, minutes):
            when = _when(start)
            begin = when.hour * 60 + when.minute
            other = _conflict(db, when.date().isoformat(), begin, begin + minutes)
            if other is not None:
                raise ToolError(f"that overlaps event {other['id']} ({other['title']} at {other['start']})")
            cur = db.execute("INSERT INTO events (title, start, minutes, location, status) VALUES (?, ?, ?, '', "
                             "'confirmed')", (title, start, minutes))
            return _event(db, cur.lastrowid)''', {"title": S, "start": WHEN, "minutes": MINUTES}),
    tool("find_contact", "Contacts whose name contains the text, with their e-mail.", '''
        def find_contact(db, name):
            found = _dicts(db.execute("SELECT id, name, email FROM contacts WHERE lower(name) LIKE ? ORDER BY id",
                                      (f"%{name.strip().lower()}%",)))
            if not found:
                raise ToolError(f"no contact whose name contains {name!r}")
            return found''', {"name": {"type": "string", "minLength": 2}}),
    tool("add_attendee", "Invite someone (by e-mail) to an event.", '''
        def add_attendee(db, event_id, email):
            _event(db, event_id)
            if "@" not in email:
                raise ToolError(f"not an e-mail address: {email!r}")
            if db.execute("SELECT 1 FROM attendees WHERE event_id = ? AND email = ?", (event_id, email)).fetchone():
                raise ToolError(f"{email} is already invited to event {event_id}")
            db.execute("INSERT INTO attendees (event_id, email) VALUES (?, ?)", (event_id, email))
            return {"event_id": event_id, "invited": email}''', {"event_id": ID, "email": S}),
    tool("remove_attendee", "Remove someone from an event's attendees.", '''
        def remove_attendee(db, event_id, email):
            _event(db, event_id)
            if db.execute("DELETE FROM attendees WHERE event_id = ? AND email = ?", (event_id, email)).rowcount == 0:
                raise ToolError(f"{email} is not invited to event {event_id}")
            return {"event_id": event_id, "removed": email}''', {"event_id": ID, "email": S}),
    tool("rename_event", "Change an event's title.", '''
        def rename_event(db, event_id, title):
            _event(db, event_id)
            db.execute("UPDATE events SET title = ? WHERE id = ?", (title, event_id))
            return _event(db, event_id)''', {"event_id": ID, "title": S}),
    tool("set_reminder", "Remind the owner some minutes before an event.", '''
        def set_reminder(db, event_id, minutes_before):
            _event(db, event_id)
            cur = db.execute("INSERT INTO reminders (event_id, minutes_before) VALUES (?, ?)", (event_id, minutes_before))
            return {"reminder": cur.lastrowid}''', {"event_id": ID, "minutes_before": {"type": "integer", "minimum": 1}}),
    tool("share_calendar", "Share the calendar with someone, read-only or with edit rights.", '''
        def share_calendar(db, email, role):
            cur = db.execute("INSERT INTO shares (email, role) VALUES (?, ?)", (email, role))
            return {"share": cur.lastrowid}''', {"email": S, "role": {"type": "string", "enum": ["viewer", "editor"]}}),
    tool("get_weather", "The weather forecast for a day.", '''
        def get_weather(db, date):
            day = _date(date)
            return {"date": day.isoformat(), "forecast": ["sunny", "cloudy", "rain"][day.toordinal() % 3]}''',
         {"date": DATE}),
    tool("get_timezone", "The calendar's time zone.", '''
        def get_timezone(db):
            return {"timezone": "Europe/Lisbon"}'''),
]


def _hhmm(t: int) -> str:
    return f"{t // 60:02d}:{t % 60:02d}"


class Calendar(ToolFamily):
    name = "calendar"
    description = "personal calendar tools: list, move, cancel events, free slots, invitations (end state checked)"

    def task(self, level: int, rng: random.Random) -> ToolTask:
        n_contacts, per_day = {1: (5, (2, 3)), 2: (8, (3, 4)), 3: (12, (3, 5))}[level]
        while True:  # regenerate until the scenario exists (deterministic in rng)
            store, monday = self._store(rng, n_contacts, per_day)
            made = (self._cancel, self._move, self._reshuffle)[level - 1](rng, store, monday)
            if made is not None:
                break
        return make_task(level, rng, "a personal calendar", store, made, LIBRARY, DOMAIN_HELPERS,
                         contacts=n_contacts, events_per_day=list(per_day))

    @staticmethod
    def _store(rng: random.Random, n_contacts: int, per_day: tuple[int, int]) -> tuple[Store, dt.date]:
        s = Store()
        names = people(rng, n_contacts)
        s.add("contacts", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("email", "TEXT NOT NULL")],
              [[i, n, f"{n.split()[0].lower()}@{n.split()[1].lower()}.example"] for i, n in enumerate(names, 1)])
        s.add("events", [("id", "INTEGER PRIMARY KEY"), ("title", "TEXT NOT NULL"), ("start", "TEXT NOT NULL"),
                         ("minutes", "INTEGER NOT NULL"), ("location", "TEXT NOT NULL"), ("status", "TEXT NOT NULL")])
        s.add("attendees", [("id", "INTEGER PRIMARY KEY"), ("event_id", "INTEGER NOT NULL REFERENCES events(id)"),
                            ("email", "TEXT NOT NULL")])
        s.add("reminders", [("id", "INTEGER PRIMARY KEY"), ("event_id", "INTEGER NOT NULL"),
                            ("minutes_before", "INTEGER NOT NULL")])
        s.add("shares", [("id", "INTEGER PRIMARY KEY"), ("email", "TEXT NOT NULL"), ("role", "TEXT NOT NULL")])
        monday = rng.choice(MONDAYS)
        for d in range(5):
            day = monday + dt.timedelta(days=d)
            for title in rng.sample(TITLES, rng.randint(*per_day)):
                Calendar._event(s, rng, title, day, rng.randrange(OPEN, CLOSE - 60, 30), rng.choice([30, 45, 60, 90]))
        return s, monday

    @staticmethod
    def _busy(s: Store, day: dt.date) -> list[tuple[int, int, int]]:
        """(start, end, id) of the confirmed events of `day`, in minutes."""
        out = []
        for e in s["events"].rows:
            if e[5] == "confirmed" and e[2].startswith(day.isoformat()):
                t = int(e[2][11:13]) * 60 + int(e[2][14:16])
                out.append((t, t + e[3], e[0]))
        return sorted(out)

    @staticmethod
    def _event(s: Store, rng: random.Random, title: str, day: dt.date, start: int, minutes: int,
               guests: list[str] | None = None, force: bool = False) -> int | None:
        end = start + minutes
        if end > CLOSE or (not force and any(b < end and start < e for b, e, _ in Calendar._busy(s, day))):
            return None
        eid = len(s["events"].rows) + 1
        s["events"].rows.append([eid, title, f"{day} {_hhmm(start)}", minutes, rng.choice(PLACES), "confirmed"])
        contacts = s["contacts"].rows
        for mail in guests if guests is not None else [c[2] for c in rng.sample(contacts, rng.randint(0, 2))]:
            s["attendees"].rows.append([len(s["attendees"].rows) + 1, eid, mail])
        return eid

    @staticmethod
    def _first_slot(s: Store, day: dt.date, minutes: int, after: int) -> int | None:
        busy = Calendar._busy(s, day)
        for t in range(after, CLOSE - minutes + 1, 30):
            if not any(b < t + minutes and t < e for b, e, _ in busy):
                return t
        return None

    @staticmethod
    def _unique_on(s: Store, day: dt.date) -> list[list]:
        events = [e for e in s["events"].rows if e[5] == "confirmed" and e[2].startswith(day.isoformat())]
        return [e for e in events if [x[1] for x in events].count(e[1]) == 1]

    # -- scenarios (None: not possible on this store) --------------------------------------------
    def _cancel(self, rng: random.Random, s: Store, monday: dt.date):
        day = monday + dt.timedelta(days=rng.randint(0, 4))
        options = self._unique_on(s, day)
        if not options:
            return None
        e = rng.choice(options)
        text = (f"Please cancel my {e[1].lower()} on {day:%A} ({day}), I can't make it. Leave the rest of my "
                "calendar as it is.")
        oracle = [call("list_events", date=day.isoformat()), call("cancel_event", event_id=e[0])]
        return Scenario(text, oracle, [after(s["events"], e[0], status="cancelled")], {"events": [e[0]]})

    def _move(self, rng: random.Random, s: Store, monday: dt.date):
        d1, d2 = rng.sample(range(5), 2)
        day, target = monday + dt.timedelta(days=d1), monday + dt.timedelta(days=d2)
        options = self._unique_on(s, day)
        if not options:
            return None
        e = rng.choice(options)
        self._event(s, rng, rng.choice(TITLES), target, NOON, 60)  # the afternoon does not start free
        slot = self._first_slot(s, target, e[3], NOON)
        if slot is None or slot == NOON:
            return None
        when = f"{target} {_hhmm(slot)}"
        text = (f"Something came up: please move my {day:%A} {e[1].lower()} to the first free slot on {target:%A} "
                f"afternoon, {target:%B} {target.day} (my afternoons run from 12:00 to 18:00, and meetings start on the hour or half hour). "
                "Keep its length, and don't change anything else.")
        oracle = [call("list_events", date=day.isoformat()),
                  call("find_free_slots", date=target.isoformat(), minutes=e[3], after="12:00"),
                  call("move_event", event_id=e[0], start=when)]
        return Scenario(text, oracle, [after(s["events"], e[0], start=when)], {"events": [e[0]]})

    def _reshuffle(self, rng: random.Random, s: Store, monday: dt.date):
        d1, d2, d3 = rng.sample(range(5), 3)
        day, target, out = (monday + dt.timedelta(days=d) for d in (d1, d2, d3))
        contacts = s["contacts"].rows
        a, b, c = rng.sample(contacts, 3)
        morning = self._event(s, rng, "Project sync", day, rng.randrange(OPEN, NOON - 60, 30), 60, [a[2]])
        later = self._event(s, rng, "Project sync", day, rng.randrange(NOON, CLOSE - 60, 30), 60, [b[2]])
        blocked = self._event(s, rng, rng.choice(TITLES), target, NOON, 60)
        mine = rng.choice([morning, later])
        who = a if mine == morning else b
        cancels = self._unique_on(s, out)
        if None in (morning, later, blocked) or not cancels:
            return None
        slot = self._first_slot(s, target, 60, NOON)
        if slot is None:
            return None
        gone, when = rng.choice(cancels), f"{target} {_hhmm(slot)}"
        text = (f"Could you sort out my week? Move {day:%A}'s project sync with {who[1]} to the first free slot on "
                f"{target:%A} afternoon, {target:%B} {target.day} (afternoons run 12:00-18:00, meetings start on the hour or half hour) and "
                f"invite {c[1]} to it as well. Also cancel my {gone[1].lower()} on {out:%A}, I'll be out that day. "
                "Nothing else should change.")
        oracle = [call("list_events", date=day.isoformat()), call("get_event", event_id=morning),
                  call("get_event", event_id=later),
                  call("find_free_slots", date=target.isoformat(), minutes=60, after="12:00"),
                  call("move_event", event_id=mine, start=when), call("find_contact", name=c[1]),
                  call("add_attendee", event_id=mine, email=c[2]), call("list_events", date=out.isoformat()),
                  call("cancel_event", event_id=gone[0])]
        want = [after(s["events"], mine, start=when), after(s["events"], gone[0], status="cancelled")]
        return Scenario(text, oracle, want, {"events": [mine, gone[0]]},
                        added=[["attendees", {"event_id": mine, "email": c[2]}]])
