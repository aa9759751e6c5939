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

from ..tools.code_text import statements
from .tool_base import DATE, ID, S, Scenario, Store, ToolFamily, after, call, email, people, tool
from .tool_code import bookings as code

TYPES = {"standard": 9000, "deluxe": 14000, "suite": 24000}
START = dt.date(2026, 3, 1)
NIGHTS = {"type": "integer", "minimum": 1, "maximum": 21}

DOMAIN_HELPERS = statements(code, "ROOM_TYPES", "_booking")

LIBRARY = [
    tool(code.find_guest, "Find guests whose name contains the given text (case-insensitive); returns id, name, "
         "email and phone of each.", {"name": {"type": "string", "minLength": 2}}),
    tool(code.list_bookings, "List a guest's bookings (any status), by check-in date.", {"guest_id": ID}),
    tool(code.get_booking, "Show one booking: guest, room, room type, check-in date, nights, status.",
         {"booking_id": ID}),
    tool(code.search_rooms, "Rooms free for every night from check_in for the given number of nights, optionally of "
         "one type, with their nightly rate in cents.",
         {"check_in": DATE, "nights": NIGHTS, "room_type": {"type": "string", "enum": list(TYPES)}},
         ["check_in", "nights"]),
    tool(code.update_booking, "Change a confirmed booking's room, check-in date and/or number of nights; the room "
         "must be free for the whole new stay.",
         {"booking_id": ID, "room": ID, "check_in": DATE, "nights": NIGHTS}, ["booking_id"]),
    tool(code.cancel_booking, "Cancel a confirmed booking.", {"booking_id": ID}),
    tool(code.create_booking, "Book a room for a guest; the room must be free for every night.",
         {"guest_id": ID, "room": ID, "check_in": DATE, "nights": NIGHTS}),
    tool(code.get_rate_card, "The hotel's nightly rates per room type (lowest and highest, in cents)."),
    tool(code.hotel_policies, "The hotel's check-in, check-out and cancellation policies."),
    tool(code.update_guest_contact, "Change a guest's e-mail address and/or phone number.",
         {"guest_id": ID, "email": S, "phone": S}, ["guest_id"]),
    tool(code.add_loyalty_points, "Credit loyalty points to a guest's account.",
         {"guest_id": ID, "points": {"type": "integer", "minimum": 1, "maximum": 10000}}),
    tool(code.request_housekeeping, "Ask housekeeping to service a room, with a note.", {"room": ID, "note": S}),
    tool(code.list_arrivals, "Confirmed bookings checking in on a date.", {"date": DATE}),
]


def _day(d: dt.date) -> str:
    return d.isoformat()


def _nice(d: str) -> str:
    day = dt.date.fromisoformat(d)
    return f"{day:%A} {day:%B} {day.day}"


class Bookings(ToolFamily):
    name = "bookings"
    description = "hotel front desk tools: find guests, search rooms, change and cancel bookings (end state checked)"
    # -- data ------------------------------------------------------------------------------------
    def fill(self, s: Store, rng: random.Random, guests: int, rooms: int) -> None:
        types = [list(TYPES)[i % 3] for i in range(rooms)]
        rng.shuffle(types)
        rates = rng.sample(range(0, 60), rooms)
        s.add("rooms", "number INTEGER PRIMARY KEY, type TEXT NOT NULL, rate_cents INTEGER NOT NULL, "
                       "floor INTEGER NOT NULL",
              [[100 * (1 + i // 6) + 1 + i % 6, t, TYPES[t] + 100 * r, 1 + i // 6]
               for i, (t, r) in enumerate(zip(types, rates))])
        names = people(rng, guests)
        s.add("guests", "id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL, phone TEXT NOT NULL, "
                        "points INTEGER NOT NULL DEFAULT 0",
              [[i, n, email(n, rng.randint(1, 99)), f"+1-555-{rng.randint(1000, 9999)}", rng.randint(0, 40) * 50]
               for i, n in enumerate(names, 1)])
        s.add("bookings", "id INTEGER PRIMARY KEY, guest_id INTEGER NOT NULL REFERENCES guests(id), "
                          "room INTEGER NOT NULL REFERENCES rooms(number), check_in TEXT NOT NULL, "
                          "nights INTEGER NOT NULL, status TEXT NOT NULL")
        s.add("housekeeping", "id INTEGER PRIMARY KEY, room INTEGER NOT NULL, note TEXT NOT NULL")
        numbers = [r[0] for r in s["rooms"].rows]
        for g in self.records_per_owner(rng, guests):
            Bookings._book(s, g, rng.choice(numbers), START + dt.timedelta(days=rng.randint(0, 50)),
                           rng.randint(1, 5), "cancelled" if rng.random() < 0.15 else "confirmed")

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
        target, twin = guests.namesake(rng)  # same name, another e-mail
        name, mail = guests.by_key()[target][1], guests.by_key()[target][2]
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

    # -- what each level offers: the store's size (its knobs), the scenario, the tools and their helpers
    domain, library, helpers = "a hotel front desk", LIBRARY, DOMAIN_HELPERS
    sizes = {1: {"guests": 8, "rooms": 9}, 2: {"guests": 14, "rooms": 12}, 3: {"guests": 20, "rooms": 15}}
    scenarios = ("_cancel", "_upgrade", "_extend")
