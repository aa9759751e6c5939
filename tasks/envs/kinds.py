"""The registry of environment kinds (`EnvSpec.kind`): what differs between a `terminal` environment
(the agent has a shell) and a `tools` environment (the agent has only its MCP server's tools), in one
place instead of `kind == ...` branches.

A kind says:
- `agent_mode`: which turn loop the harness runs (`tasks/agent/harness.py` `MODES`: `bash` or `mcp`);
- `harness`: the `Rollout.harness` label its episodes carry by default (its own turn loop, `agent_mode`);
  `rollout.harnesses` may run its episodes under other registered harnesses (tasks/agent/harnesses);
- `checks`: validator checks it adds after `no_leak` (`KindCheck`: check name, reject reason, and a
  function of (sandbox, env, timeout) returning why it fails, or None);
- `replay_call`: how a recorded command replays (None: as a shell command; else a parser giving the tool
  call it stands for, or None for a command to replay as `bash`);
- `view`: the short JSON summary `trajforge envs sample` prints without `--full` (None: the whole spec);
- `layer`: the image its environments build on instead of the base, as a function of (docker client,
  base image id, env, whether builds may use the network) returning an image id (None: the base itself; tools: the base + the MCP SDK,
  + Node.js for a brought Node server);
- `confined`: why what the reference solution changed breaks the kind's contract (tools: anything but
  the store; the reject `tools_write_outside_store`).

Invariants: a kind is registered once per name (`register` replaces an entry of the same name, which
tests use for a toy kind); `EnvSpec` accepts exactly the registered names (`schemas.environment.ENV_KINDS`,
filled by `register`); `get` of an unknown name raises KeyError naming the known ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...schemas.environment import ENV_KINDS, EnvSpec
from ...schemas.trajectory import BASH_HARNESS, TOOLS_HARNESS
from .tools.client import outside_store, serve_error
from .tools.layer import ensure_tools_layer
from .tools.spec import parse_call_command, tool_view

__all__ = ["BASH_HARNESS", "KINDS", "Kind", "KindCheck", "get", "of", "register"]


@dataclass(frozen=True)
class KindCheck:
    """A validator check a kind adds: `run(sandbox, env, timeout_s)` says why it fails (None: it passes)."""

    name: str
    reason: str
    run: Callable[[Any, EnvSpec, float], str | None]


@dataclass(frozen=True)
class Kind:
    name: str
    agent_mode: str
    harness: str
    checks: tuple[KindCheck, ...] = ()
    replay_call: Callable[[str], tuple[str, dict[str, Any]] | None] | None = None
    view: Callable[[EnvSpec, bool], dict] | None = field(default=None)
    # (docker client, base image id) -> the id of the image this kind's environments build on instead
    layer: Callable[[Any, str, EnvSpec, bool], str] | None = None
    # (env, paths the reference solution changed) -> why they break the kind's contract (None: they do not)
    confined: Callable[[EnvSpec, list[str]], str | None] | None = None


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    KINDS[kind.name] = kind
    ENV_KINDS.add(kind.name)
    return kind


def get(name: str) -> Kind:
    if name not in KINDS:
        raise KeyError(f"unknown environment kind {name!r}; known: {', '.join(sorted(KINDS))}")
    return KINDS[name]


def of(env: EnvSpec) -> Kind:
    """The kind of `env`."""
    return get(env.kind)


TERMINAL = register(Kind(name="terminal", agent_mode="bash", harness=BASH_HARNESS))
TOOLS = register(Kind(name="tools", agent_mode="mcp", harness=TOOLS_HARNESS,
                      checks=(KindCheck("tools_serve", "tools_broken", serve_error),),
                      replay_call=parse_call_command, view=tool_view, layer=ensure_tools_layer,
                      confined=outside_store))
