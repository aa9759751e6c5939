"""Harness `trajforge-mcp-v1`: a `tools` environment's MCP tools + `submit`, each call relayed to the
environment's server in the sandbox (`ToolMode`, tasks/agent/mcp_relay.py: its module docstring is this
harness's contract). The replay teacher sends a reference command in the oracle's form (`server.py call NAME
'ARGS'`) as that tool call (the kind's `replay_call`)."""

from __future__ import annotations

from ....schemas.trajectory import TOOLS_HARNESS
from ..harness import MODES
from . import Harness, register

HARNESS = register(Harness(name=TOOLS_HARNESS, kinds=("tools",), mode=MODES["mcp"],
                           description="the environment's MCP tools + submit, relayed to its server"))
