"""A plugin (`plugins: [planted_tools]`) registering two planted-broken tool families for the build tests:

- `planted_tools_broken`: its tools.py fails to import (a missing module): the server cannot serve;
- `planted_tools_noop`: its end-state check already passes on the untouched store.

Both are otherwise well-formed `ToolTask`s, so only the validator's checks can reject them.
`unregister()` removes them again (the registry is process-wide).
"""

from __future__ import annotations

import random

from trajforge.tasks.envs.families import FAMILIES, register
from trajforge.tasks.envs.families.tool_base import ToolFamily
from trajforge.tasks.envs.tools.spec import OracleCall, ToolDef, ToolTask

SET_TOOL = ToolDef(
    name="set_counter", description="Set the value of a named counter.",
    parameters={"type": "object", "properties": {"name": {"type": "string"}, "value": {"type": "integer"}},
                "required": ["name", "value"], "additionalProperties": False},
    code="def set_counter(db, name, value):\n"
         "    if not db.execute('SELECT 1 FROM counters WHERE name = ?', (name,)).fetchone():\n"
         "        raise ToolError(f'no counter {name}')\n"
         "    db.execute('UPDATE counters SET value = ? WHERE name = ?', (value, name))\n"
         "    return {'ok': True}\n")


def _task(rng: random.Random, checks: str, helpers: str = "") -> ToolTask:
    target = rng.randint(10, 99)
    return ToolTask(
        domain="a counter board", instruction=f"The counter named 'alpha' must end up at {target}; leave the others.",
        schema_sql="CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        seed_sql=f"INSERT INTO counters VALUES ('alpha', 1), ('beta', {target});",
        tools=[SET_TOOL], helpers=helpers, checks=checks, expected={"target": target},
        oracle=[OracleCall(name="set_counter", arguments={"name": "alpha", "value": target})])


class PlantedBroken(ToolFamily):
    name = "planted_tools_broken"
    description = "planted: tools.py fails to import"
    levels = (1,)

    def task(self, level: int, rng: random.Random) -> ToolTask:
        return _task(rng, "def test_alpha():\n    assert value('SELECT value FROM counters WHERE name = ?', 'alpha') "
                          "== EXPECTED['target']\n", helpers="import trajforge_no_such_module  # planted")


class PlantedNoop(ToolFamily):
    name = "planted_tools_noop"
    description = "planted: the check passes on the untouched store"
    levels = (1,)

    def task(self, level: int, rng: random.Random) -> ToolTask:  # its check reads a row the seed already sets
        degrees = rng.randint(16, 24)
        return ToolTask(
            domain="a building's thermostats",
            instruction=f"Turn the thermostat of the north meeting room to {degrees} degrees for the visitors.",
            schema_sql="CREATE TABLE thermostats (room TEXT PRIMARY KEY, celsius INTEGER NOT NULL, owner TEXT)",
            seed_sql=f"INSERT INTO thermostats VALUES ('north', 19, 'facilities'), ('lobby', {degrees}, 'front desk');",
            tools=[ToolDef(name="set_temperature", description="Set a room's thermostat (degrees Celsius).",
                           parameters={"type": "object", "properties": {"room": {"type": "string"},
                                                                        "celsius": {"type": "integer"}},
                                       "required": ["room", "celsius"]},
                           code="def set_temperature(db, room, celsius):\n"
                                "    db.execute('UPDATE thermostats SET celsius = ? WHERE room = ?', (celsius, room))\n"
                                "    return {'room': room, 'celsius': celsius}\n")],
            checks="def test_lobby_kept():\n    assert value('SELECT celsius FROM thermostats WHERE room = ?', "
                   "'lobby') == EXPECTED['degrees']\n",
            expected={"degrees": degrees}, oracle=[OracleCall(name="set_temperature",
                                                              arguments={"room": "north", "celsius": degrees})])


PLANTED = [register(PlantedBroken()), register(PlantedNoop())]


def unregister() -> None:
    for f in PLANTED:
        FAMILIES.pop(f.name, None)

