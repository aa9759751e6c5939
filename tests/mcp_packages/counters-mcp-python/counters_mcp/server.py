"""A counter board as an MCP server, the SDK's way (tests/mcp_servers/counters-python, packaged)."""

import os
import sqlite3

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("counters-mcp", version="1.0.0")


def store() -> sqlite3.Connection:
    """The SQLite store the environment gives the server ($TRAJFORGE_STORE); its only state."""
    return sqlite3.connect(os.environ["TRAJFORGE_STORE"])


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


def main() -> None:
    app.run()


if __name__ == "__main__":
    main()
