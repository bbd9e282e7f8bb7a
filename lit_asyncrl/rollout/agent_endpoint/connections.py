"""How agents reach the endpoint: over its loopback socket (other processes), kept out of the processes
this one forks, or without a socket (agents in this process, through httpx's ASGI transport)."""

from __future__ import annotations

import os
import socket
import weakref
from typing import Any


def hidden_from_forked_children(listener: socket.socket) -> None:
    """A process forked from this one (an engine core starting or restarting after the endpoint) would hold
    a copy of the listening socket: the port would stay open, taking connections nobody answers, until that
    process ends (seen with `ss -ltnp`: the engine core listed on the endpoint's port). In such a child the
    descriptor is pointed at /dev/null (not closed: its number must not be reused under the socket object)."""
    descriptor = listener.fileno()
    owner = weakref.ref(listener)

    def in_child() -> None:
        held = owner()
        if held is not None and held.fileno() == descriptor:  # still this endpoint's open socket
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, descriptor, inheritable=False)
            os.close(null)

    os.register_at_fork(after_in_child=in_child)


def in_process_connections(app: Any) -> Any:
    """An httpx client that every in-process agent of one loop uses, calling `app` without a socket; only
    the endpoint closes it."""
    import httpx

    class InProcessConnections(httpx.AsyncClient):
        async def aclose(self) -> None:  # an agent closing its client (`async with client:`) keeps it for the others
            return None

        async def close_pool(self) -> None:
            await super().aclose()

    # An error inside the application answers 500, as over the socket, instead of raising in the agent.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return InProcessConnections(transport=transport, timeout=None)
