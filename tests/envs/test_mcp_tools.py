"""Tools from a real stdio MCP server (`tests/integration/mcp_server.py`) through the `mcp` SDK."""

from __future__ import annotations

import asyncio
import sys

import psutil
import pytest

from lit_asyncrl.envs.tools import Tool
from lit_asyncrl.envs.tools.mcp_tools import McpServerTools, McpToolError


def server_processes() -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process().children(recursive=True)
        if "tests.integration.mcp_server" in " ".join(child.cmdline())
    ]


def test_the_servers_tools_are_listed_with_their_schemas_called_and_the_server_stopped(tmp_path):
    count_file = tmp_path / "count"
    server = McpServerTools(sys.executable, ["-m", "tests.integration.mcp_server", str(count_file)])
    server.start()
    try:
        assert len(server_processes()) == 1
        tools = {tool.name: tool for tool in server.tools()}
        assert sorted(tools) == ["add", "divide"] and all(isinstance(tool, Tool) for tool in tools.values())
        assert tools["add"].schema["function"]["description"] == "Add two integers."
        assert tools["add"].argument_errors({"a": 1, "b": 2}) is None
        assert (
            tools["add"].argument_errors({"a": "x", "b": 2}) == "'x' is not of type 'integer'"
        )  # the server's own schema

        async def calls():
            added = await tools["add"].function(a=2, b=3)
            added_again = await tools["add"].function(a=4, b=4)
            with pytest.raises(McpToolError, match="Error executing tool divide"):  # the server says no more
                await tools["divide"].function(a=1, b=0)
            return added, added_again

        assert asyncio.run(calls()) == ("5", "8")
        assert count_file.read_text() == "2"  # the server's own count
    finally:
        server.close()
    assert server_processes() == []
    server.close()  # twice is fine


def test_a_server_that_cannot_start_is_reported_with_what_it_said():
    server = McpServerTools(
        sys.executable, ["-c", "import sys; sys.stderr.write('no such server here'); sys.exit(3)"], start_timeout_s=30
    )
    with pytest.raises(RuntimeError, match="did not start") as failure:
        server.start()
    assert "no such server here" in str(failure.value)
    assert not server.started
