"""A small stdio MCP server for the tests: `python -m tests.integration.mcp_server COUNT_FILE`.

It adds two numbers, and writes how many calls it has served to COUNT_FILE after each one: the
server's own count, read by the tests after the run.
"""

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("adder", log_level="ERROR")
served = 0


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    global served
    served += 1
    Path(sys.argv[1]).write_text(str(served))
    return a + b


@server.tool()
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


if __name__ == "__main__":
    server.run("stdio")
