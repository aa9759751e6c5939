"""A counter board as an MCP server, written the SDK's way: tool functions, schemas from type hints."""

import os  # noqa: F401  (the planted-server tests edit this file and use it)

from board import store
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("counter-board", version="1.2.0")


@app.tool()
def list_counters() -> dict[str, int]:
    """Every counter and its value."""
    with store() as db:
        return dict(db.execute("SELECT name, value FROM counters ORDER BY name"))


@app.tool()
def set_counter(name: str, value: int) -> dict[str, int]:
    """Set the value of a named counter."""
    with store() as db:
        if db.execute("UPDATE counters SET value = ? WHERE name = ?", (value, name)).rowcount == 0:
            raise ToolError(f"no counter {name!r}")
    return {name: value}


if __name__ == "__main__":
    app.run()
