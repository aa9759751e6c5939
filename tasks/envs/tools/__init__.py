"""Environments of kind `tools`: stateful tool servers, verified by their end state.

- `server.py`: the MCP stdio server that runs inside the sandbox (standard library only);
- `spec.py`: `ToolTask`, the one shape procedural families and LLM synthesis write, and its
  compilation into an ordinary `EnvSpec` (kind `tools`);
- `family.py`: `ToolFamily`, the base of procedural tool families (`families/`).
"""

# The family registry (tasks/envs/families) imports the tool families, which import this package's
# modules, and `spec`/`family` import `families.base`: loading the registry first, whatever module of
# this package is imported first, keeps that cycle from meeting a half-initialised module.
from .. import families as _families  # noqa: E402,F401
