"""The runtime of environments of kind `tools` (stateful tool servers, verified by their end state):

- `server.py`: the MCP stdio server that runs inside the sandbox (on the MCP SDK; its store logic is
  standard library only);
- `client.py`: the host side: one SDK client session over `docker exec -i` (the harness's relay and
  the validator's `tools_serve`);
- `layer.py`: the tools layer (the base image + the pinned SDK) tool environment images build on;
- `spec.py`: `ToolTask`, the one shape procedural families and LLM synthesis write, and its
  compilation into an ordinary `EnvSpec` (kind `tools`), with the hidden checks of `checks.py`;
- `code_text.py`: the source text of sandbox code kept in real modules.

The tool families live with the others in tasks/envs/families (`tool_base.py`, `tool_code/`), their
LLM synthesis in tasks/envs/synthesis; the kind itself is registered in tasks/envs/kinds.py.
"""

# The family registry (tasks/envs/families) imports the tool families, which import this package's
# modules, and `spec` imports `families.base`: loading the registry first, whatever module of this
# package is imported first, keeps that cycle from meeting a half-initialised module.
from .. import families as _families  # noqa: E402,F401
