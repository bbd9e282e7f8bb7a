"""The service desk's world: a customer's orders, their request, what they know, and the desk's
policy (`decide`), which the reward checks and the scripted agent plays (`service_desk.py`)."""

from __future__ import annotations

import dataclasses
import re

#: Statuses an order starts with; `refunded` only ever results from the agent's refund.
STATUSES = ("placed", "shipped", "delivered", "cancelled")
#: Words `reply` accepts: the outcome of a refund or cancel request, or the answer to `where`.
REPLY_WORDS = ("done", "no", *STATUSES, "refunded")
ITEMS = ("mug", "hat", "pen", "cup", "bag", "toy", "box", "map")
REQUEST_KINDS = ("refund", "cancel", "where")
WRITE_TOOLS = {"refund": "refunded", "cancel": "cancelled"}  # tool -> the status it sets
#: Share of the refused refund requests whose order was delivered too long ago (the number rule);
#: the rest are orders that are not delivered at all (the status rule).
TOO_OLD_SHARE = 0.8

#: Words in a question that ask for the order's id (the cooperative customer answers with it).
ID_WORDS = ("id", "number", "order", "which")


@dataclasses.dataclass(frozen=True)
class Order:
    order_id: int
    item: str
    status: str
    days: int  # since delivery for a delivered order, since the order otherwise

    def record(self, status: str | None = None) -> str:
        """What `look` shows, with the episode's current `status` when given."""
        return f"{self.order_id} {self.item} {status or self.status} {self.days}d\n"


@dataclasses.dataclass(frozen=True)
class DeskInstance:
    """A customer's orders (sorted by id) and their request about one of them."""

    orders: tuple[Order, ...]
    request: str  # one of REQUEST_KINDS
    order_id: int

    def order(self, order_id: int) -> Order:
        return next(order for order in self.orders if order.order_id == order_id)


@dataclasses.dataclass(frozen=True)
class CustomerGoal:
    """What the customer of a desk conversation wants and knows (a `UserGoal`)."""

    request: str  # one of REQUEST_KINDS
    item: str
    order_id: int

    @property
    def instructions(self) -> str:
        want = (
            f"to know where your {self.item} is" if self.request == "where" else f"to {self.request} your {self.item}"
        )
        return (
            f"You are a customer writing to an online shop's service desk. You want {want}; its order number "
            f"is {self.order_id}. Answer the agent's question in a few words, and give the order number when asked."
        )

    def answer(self, question: str) -> str:
        asks_for_id = any(word in re.findall(r"[a-z]+", question.lower()) for word in ID_WORDS)
        return str(self.order_id) if asks_for_id else f"{self.request} {self.item}"


@dataclasses.dataclass(frozen=True)
class DeskDifficulty:
    num_orders: int  # orders in the customer's database
    requests: tuple[str, ...]  # request kinds drawn (uniformly)
    # Delivered orders lie within this many days of the window's edge; None = anywhere in 1..2*window.
    edge_days: int | None


DIFFICULTIES = {
    "easy": DeskDifficulty(num_orders=1, requests=("refund",), edge_days=None),
    "medium": DeskDifficulty(num_orders=2, requests=("refund", "cancel"), edge_days=None),
    "hard": DeskDifficulty(num_orders=4, requests=REQUEST_KINDS, edge_days=5),
}


def decide(request: str, status: str, days: int, refund_window_days: int) -> tuple[str | None, str]:
    """The desk's policy: the write tool to call (None = change nothing) and the reply word."""
    if request == "where":
        return None, status
    if request == "refund" and status == "delivered" and days <= refund_window_days:
        return "refund", "done"
    if request == "cancel" and status == "placed":
        return "cancel", "done"
    return None, "no"
