"""The MCP server (`qvl-agent mcp`): `tools.py` does the work on one resident engine, `server.py` exposes it
as MCP tools on the official SDK over stdio or streamable HTTP."""
