"""The service desk's scripted agent: its demonstrations for the warm start."""

from __future__ import annotations

import re

from lit_asyncrl.envs.service_desk.orders import decide

_REQUEST = re.compile(r"user: ([a-z]+) ([0-9]+)\n")
#: A request that names the item, not the order (with a simulated user): the agent asks for the id.
_VAGUE_REQUEST = re.compile(r"user: ([a-z]+) ([a-z]+)\n")
_USER_ANSWER = re.compile(r"user: ([0-9]+)\n")
_RECORD = re.compile(r"([0-9]+) [a-z]+ ([a-z]+) ([0-9]+)d\n")


class ScriptedAgent:
    """Plays the desk from what it is shown (the request and the tool answers), never the instance.

    Asks for the order id when the request names only the item, looks the order up, then applies
    `decide` to the record: the write tool and `reply done`, or the reply at once. One agent per
    episode; `act` takes the previous observation (first the prompt).
    """

    def __init__(self, refund_window_days: int) -> None:
        self.refund_window_days = refund_window_days
        self.request: str | None = None
        self.pending_reply: str | None = None

    def act(self, observation: str) -> str:
        if (request := _REQUEST.fullmatch(observation)) is not None:
            self.request = request.group(1)
            return f"look {request.group(2)}\n"
        if (request := _VAGUE_REQUEST.fullmatch(observation)) is not None:
            self.request = request.group(1)
            return "ask id\n"
        if (answer := _USER_ANSWER.fullmatch(observation)) is not None and self.request is not None:
            return f"look {answer.group(1)}\n"
        if (record := _RECORD.fullmatch(observation)) is not None and self.request is not None:
            order_id = record.group(1)
            status = record.group(2)
            days = int(record.group(3))
            write, self.pending_reply = decide(self.request, status, days, self.refund_window_days)
            return f"{write} {order_id}\n" if write else f"reply {self.pending_reply}\n"
        if observation == "ok\n" and self.pending_reply is not None:
            return f"reply {self.pending_reply}\n"
        raise ValueError(f"ScriptedAgent cannot answer the observation {observation!r}")
