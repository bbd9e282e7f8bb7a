"""Tools from an MCP server: a stdio server started for the run, its tools listed and called through
the `mcp` SDK (an extra: `pip install "lit-asyncrl[mcp]"`).

The client lives on a thread of its own with its own event loop (the SDK's session is bound to the
loop it was opened on); a call from an episode, on the engine's loop, is handed to that loop and
awaited there, so it holds up no other episode. The server is a child process of the trainer:
`close` ends it (the task calls it from `Environment.close`, which the runner calls on every way
out), and after a SIGKILL the trainer's reaper kills it with its other processes (a stdio server
also ends by itself when its stdin closes, i.e. when the trainer's process is gone). What the server
writes to stderr is kept in an unlinked temporary file and quoted when it fails to start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from lit_asyncrl.envs.tools.tool import Tool


class McpToolError(RuntimeError):
    """The MCP server answered a call with an error (the episode answers the model with its text)."""


class McpServerTools:
    """An MCP server over stdio and its tools as `Tool`s.

    Args:
        command: the server's executable (e.g. `sys.executable` or "npx").
        args: its arguments (e.g. `["-m", "my_server"]`).
        env: its environment (None: the SDK's default, a safe subset of this one).
        start_timeout_s: the most seconds the server may take to start and list its tools.
    """

    def __init__(
        self, command: str, args: Sequence[str] = (), env: dict[str, str] | None = None, start_timeout_s: float = 60.0
    ) -> None:
        self.command = command
        self.args = list(args)
        self.env = env
        self.start_timeout_s = start_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._listed: list[Any] = []

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the server and list its tools (returns once they are listed; idempotent)."""
        if self.started:
            return
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._serve(ready),), name="lit-asyncrl-mcp", daemon=True
        )
        self._thread.start()
        try:
            ready.result(timeout=self.start_timeout_s)
        except BaseException:
            self.close()
            raise

    async def _serve(self, ready: concurrent.futures.Future) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self._stop = asyncio.Event()
        with tempfile.TemporaryFile("w+") as errlog:
            try:
                parameters = StdioServerParameters(command=self.command, args=self.args, env=self.env)
                async with (
                    stdio_client(parameters, errlog=errlog) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    self._listed = list((await session.list_tools()).tools)
                    self._session = session
                    ready.set_result(None)
                    await self._stop.wait()
            except BaseException as error:
                if not ready.done():
                    errlog.seek(0)
                    said = errlog.read()[-2000:]
                    ready.set_exception(
                        RuntimeError(
                            f"the MCP server `{self.command} {' '.join(self.args)}` did not start: {error!r}\n{said}"
                        )
                    )
                elif not isinstance(error, asyncio.CancelledError):
                    raise
            finally:
                self._session = None

    def tools(self) -> list[Tool]:
        """The server's tools, each calling the server; starts the server if it is not running (the
        run's start-up checks open an episode, and so list the tools, before `Environment.start`)."""
        self.start()
        return [
            Tool(
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description or "",
                        "parameters": tool.input_schema,
                    },
                },
                self._caller(tool.name),
            )
            for tool in self._listed
        ]

    def _caller(self, name: str):
        async def call(**arguments: Any) -> str:
            session = self._session
            loop = self._loop
            if session is None or loop is None:
                raise McpToolError("the MCP server is not running")
            result = await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(session.call_tool(name, arguments), loop)
            )
            text = "\n".join(getattr(item, "text", "") for item in result.content)
            if result.is_error:
                raise McpToolError(text)
            return text if text or result.structured_content is None else json.dumps(result.structured_content)

        call.__name__ = name
        return call

    def close(self) -> None:
        """Stop the session and the server (safe to call twice and before `start`)."""
        loop = self._loop
        thread = self._thread
        if loop is not None and thread is not None and thread.is_alive():
            if self._stop is not None:
                loop.call_soon_threadsafe(self._stop.set)
            thread.join(timeout=30)
        if loop is not None and not loop.is_running():
            with contextlib.suppress(Exception):
                loop.close()
        self._loop = self._thread = None
