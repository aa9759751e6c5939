"""A counter board as an MCP server (the `counters-mcp` package)."""
