"""The harness registry: how a model's turn becomes actions and observations (issue 44).

A harness is one module and one `register(Harness(...))`. It declares:
- `name`: the config name (`rollout.harnesses`) and the `Rollout.harness` label of its episodes;
- `kinds`: the environment kinds it can drive (tasks/envs/kinds.py);
- `mode`: (episode, env) -> the object that runs its turns over the episode's sandbox (`offered()`: the
  OpenAI tool schemas; `system_prompt(env)`; `handle_tool_calls` / `handle_text`: how a reply becomes
  actions and observations, `submit` ending the episode; `what`: what a valid reply carries; optional
  `close()`; optional `async opening(env)`: the first messages, when the harness writes them itself instead of
  system prompt + instruction; a mode whose own loop ends the episode sets `st.ended = (status, error)`). The episode lifecycle around it (start, budget, settle, capture, in-place tests) is
  tasks/agent/harness.py's and never changes with the harness;
- `render`: how the replay teacher renders a recorded command list (a reference solution) into this
  harness's tool calls, [(tool, arguments)], "bash" calls included (None: each command as a `bash` call).

Invariants: a name is registered once (`register` replaces an entry of the same name, which tests use for
a toy harness) and joins `schemas.trajectory.HARNESS_NAMES`, which the config validates against; `get` of
an unknown name raises KeyError naming the registered ones; the built-ins register when this package is
imported. An environment runs under the listed harnesses that drive its kind, else under its kind's own
harness (`Kind.harness`, whose turn loop is `Kind.agent_mode`), so the default episode is unchanged and
its rollout id too (`episode_harness`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ....schemas.environment import EnvSpec
from ....schemas.trajectory import HARNESS_NAMES
from ...envs.kinds import of as kind_of
from ...teachers.base import Replaying

Call = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Harness:
    name: str
    kinds: tuple[str, ...]
    mode: Callable[[Any, EnvSpec], Any]
    render: Callable[[EnvSpec, list[str]], list[Call]] | None = None
    description: str = ""


HARNESSES: dict[str, Harness] = {}


def register(harness: Harness) -> Harness:
    HARNESSES[harness.name] = harness
    HARNESS_NAMES.add(harness.name)
    return harness


def get(name: str) -> Harness:
    if name not in HARNESSES:
        raise KeyError(f"unknown harness {name!r}; registered: {', '.join(sorted(HARNESSES))}")
    return HARNESSES[name]


def harnesses_for(env: EnvSpec, names: list[str] | None) -> list[str]:
    """The harnesses `env` runs under for `rollout.harnesses` = `names`: those that drive its kind, in the
    listed order, else its kind's own harness (always at least one)."""
    fit = [n for n in names or [] if n in HARNESSES and env.kind in HARNESSES[n].kinds]
    return fit or [kind_of(env).harness]


def own(env: EnvSpec, name: str | None) -> bool:
    """Whether `name` is `env`'s kind's own harness (None counts as it): its episodes keep the rollout ids and the
    turn loop (`Kind.agent_mode`) they had before harnesses could be chosen."""
    return name is None or name == kind_of(env).harness


def episode_harness(env: EnvSpec, name: str | None) -> str | None:
    """What goes into the rollout id besides (env, teacher, sample): None for the kind's own harness."""
    return None if own(env, name) else name


def bind_rendering(session: Any, env: EnvSpec, name: str | None) -> Any:
    """`session`, told how harness `name` renders recorded commands when it replays them (`teachers.base.Replaying`,
    the replay teacher's sessions) and the harness is not the kind's own; any other session as it is."""
    if not own(env, name):
        h = get(name)
        if h.render is not None and isinstance(session, Replaying):
            session.render_with(lambda commands: h.render(env, commands))
    return session


from . import bash, mcp, mini_swe_agent, swe, terminal  # noqa: E402,F401  (the built-in harnesses register themselves)
