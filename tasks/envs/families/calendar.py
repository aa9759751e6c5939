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

from ..tools.code_text import statements
from .tool_base import DATE, ID, S, Scenario, Store, ToolFamily, after, call, people, tool
from .tool_code import calendar as code

MONDAYS = [dt.date(2026, 3, 2) + dt.timedelta(weeks=w) for w in range(16)]
TITLES = ["Dentist", "Team standup", "Budget review", "Design review", "Haircut", "Call with the bank", "Car service",
          "Gym", "Vet appointment", "Quarterly planning", "Interview", "Physio", "Parent-teacher meeting"]
PLACES = ["Room 4B", "Video call", "Downtown", "Main office", "Clinic", "Cafe Lindt"]
OPEN, CLOSE, NOON = 8 * 60, 18 * 60, 12 * 60
WHEN = {"type": "string", "minLength": 16, "maxLength": 16, "description": "YYYY-MM-DD HH:MM"}
HHMM = {"type": "string", "minLength": 5, "maxLength": 5, "description": "HH:MM"}
MINUTES = {"type": "integer", "minimum": 15, "maximum": 480}

DOMAIN_HELPERS = statements(code, "OPEN", "_conflict")

LIBRARY = [
    tool(code.list_events, "Confirmed events on a day: id, title, start, minutes, location.", {"date": DATE}),
    tool(code.search_events, "Confirmed events whose title contains the text.",
         {"text": {"type": "string", "minLength": 2}}),
    tool(code.get_event, "One event with its attendees (e-mail and, for contacts, name).", {"event_id": ID}),
    tool(code.find_free_slots, "Start times (half-hour steps) on a day when a meeting of the given length fits "
         "between no other events, within the working day 08:00-18:00 or between after/before.",
         {"date": DATE, "minutes": MINUTES, "after": HHMM, "before": HHMM}, ["date", "minutes"]),
    tool(code.move_event, "Move a confirmed event to a new start time (same length); it must not overlap another "
         "event and must fit in the working day.", {"event_id": ID, "start": WHEN}),
    tool(code.cancel_event, "Cancel a confirmed event.", {"event_id": ID}),
    tool(code.create_event, "Create an event; it must not overlap another one.",
         {"title": S, "start": WHEN, "minutes": MINUTES}),
    tool(code.find_contact, "Contacts whose name contains the text, with their e-mail.",
         {"name": {"type": "string", "minLength": 2}}),
    tool(code.add_attendee, "Invite someone (by e-mail) to an event.", {"event_id": ID, "email": S}),
    tool(code.remove_attendee, "Remove someone from an event's attendees.", {"event_id": ID, "email": S}),
    tool(code.rename_event, "Change an event's title.", {"event_id": ID, "title": S}),
    tool(code.set_reminder, "Remind the owner some minutes before an event.",
         {"event_id": ID, "minutes_before": {"type": "integer", "minimum": 1}}),
    tool(code.share_calendar, "Share the calendar with someone, read-only or with edit rights.",
         {"email": S, "role": {"type": "string", "enum": ["viewer", "editor"]}}),
    tool(code.get_weather, "The weather forecast for a day.",
         {"date": DATE}),
    tool(code.get_timezone, "The calendar's time zone."),
]


def _hhmm(t: int) -> str:
    return f"{t // 60:02d}:{t % 60:02d}"


class Calendar(ToolFamily):
    name = "calendar"
    description = "personal calendar tools: list, move, cancel events, free slots, invitations (end state checked)"

    def attempt(self, level: int, rng: random.Random) -> tuple[Store, Scenario | None]:
        store, monday = self._store(rng, **self.sizes[level])
        return store, (self._cancel, self._move, self._reshuffle)[level - 1](rng, store, monday)

    @staticmethod
    def _store(rng: random.Random, contacts: int, events_per_day: list[int]) -> tuple[Store, dt.date]:
        n_contacts, per_day = contacts, events_per_day
        s = Store()
        names = people(rng, n_contacts)
        s.add("contacts", "id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL",
              [[i, n, f"{n.split()[0].lower()}@{n.split()[1].lower()}.example"] for i, n in enumerate(names, 1)])
        s.add("events", "id INTEGER PRIMARY KEY, title TEXT NOT NULL, start TEXT NOT NULL, minutes INTEGER NOT NULL, "
                        "location TEXT NOT NULL, status TEXT NOT NULL")
        s.add("attendees", "id INTEGER PRIMARY KEY, event_id INTEGER NOT NULL REFERENCES events(id), "
                           "email TEXT NOT NULL")
        s.add("reminders", "id INTEGER PRIMARY KEY, event_id INTEGER NOT NULL, minutes_before INTEGER NOT NULL")
        s.add("shares", "id INTEGER PRIMARY KEY, email TEXT NOT NULL, role TEXT NOT NULL")
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

    # -- what each level offers: the store's size (its knobs), the scenario, the tools and their helpers
    domain, library, helpers = "a personal calendar", LIBRARY, DOMAIN_HELPERS
    sizes = {1: {"contacts": 5, "events_per_day": [2, 3]}, 2: {"contacts": 8, "events_per_day": [3, 4]},
             3: {"contacts": 12, "events_per_day": [3, 5]}}
