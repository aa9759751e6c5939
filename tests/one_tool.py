"""A plugin (`plugins: [one_tool]`) registering `one_tool_counter`: a tool family whose environments offer
one tool (`set_counter`) and ask for one call of it, the smallest tool task a model can do. The real-vLLM
tool-calling test (tests/test_vllm_e2e.py) runs it. `unregister()` removes it (the registry is process-wide)."""

from __future__ import annotations

import random

from planted_tools import SET_TOOL

from trajforge.tasks.envs.families import FAMILIES, register
from trajforge.tasks.envs.families.tool_base import ToolFamily
from trajforge.tasks.envs.tools.spec import OracleCall, ToolTask

NAMES = ("alpha", "beta", "gamma", "delta")


class OneToolCounter(ToolFamily):
    name = "one_tool_counter"
    description = "one tool, one call: set a named counter to a value"
    levels = (1,)

    def task(self, level: int, rng: random.Random) -> ToolTask:
        name, target = rng.choice(NAMES), rng.randint(10, 99)
        return ToolTask(
            domain="a counter board", instruction=f"The counter named '{name}' must end up at {target}; leave the others.",
            schema_sql="CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
            seed_sql="".join(f"INSERT INTO counters VALUES ('{n}', {i + 1});" for i, n in enumerate(NAMES)),
            tools=[SET_TOOL], expected={"name": name, "target": target},
            checks="def test_counter():\n    assert value('SELECT value FROM counters WHERE name = ?', EXPECTED['name']) "
                   "== EXPECTED['target']\n\n"
                   "def test_others_kept():\n    assert value('SELECT count(*) FROM counters WHERE value <= 4') == 3\n",
            oracle=[OracleCall(name="set_counter", arguments={"name": name, "value": target})])


FAMILY = register(OneToolCounter())


def unregister() -> None:
    FAMILIES.pop(FAMILY.name, None)
