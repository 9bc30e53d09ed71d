"""What an MCP client lists: tool descriptions as flat text, without the source code's indentation."""

from __future__ import annotations

import anyio
from mcp import Client

from qvl_agent.config import Settings
from qvl_agent.engine.replay import ReplayEngine
from qvl_agent.mcp_server.server import build_server
from qvl_agent.mcp_server.tools import ScreenTools


def _texts(schema) -> list[str]:
    """Every description in a JSON schema, nested ones included."""
    if isinstance(schema, dict):
        own = [schema["description"]] if isinstance(schema.get("description"), str) else []
        return own + [t for value in schema.values() for t in _texts(value)]
    if isinstance(schema, list):
        return [t for value in schema for t in _texts(value)]
    return []


def test_listed_tool_descriptions_carry_no_indentation_runs():
    server = build_server(ScreenTools(ReplayEngine([]), Settings()))

    async def listed():
        async with Client(server) as client:
            return (await client.list_tools()).tools

    tools = anyio.run(listed)
    assert {t.name for t in tools} == {"ask_screen", "locate", "run_task", "browse", "screenshot", "replay"}
    for tool in tools:
        assert len(tool.description) > 40, tool.name
        for text in [tool.description, *_texts(tool.input_schema)]:
            for line in text.splitlines():
                assert line == line.lstrip(), f"{tool.name}: {line!r}"
            assert "  " not in text, f"{tool.name}: {text!r}"


def test_readme_and_server_docs_name_every_tool_the_server_lists():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    server = build_server(ScreenTools(ReplayEngine([]), Settings()))

    async def listed():
        async with Client(server) as client:
            return (await client.list_tools()).tools

    names = {t.name for t in anyio.run(listed)}
    readme = root.joinpath("README.md").read_text(encoding="utf-8")
    mcp_line = readme[readme.index("**MCP**") :].split("\n\n")[0]
    table = root.joinpath("docs", "server.md").read_text(encoding="utf-8")
    for name in names:
        assert f"`{name}`" in mcp_line, f"README's MCP paragraph leaves out {name}"
        assert f"| `{name}(" in table, f"docs/server.md's tool table leaves out {name}"
