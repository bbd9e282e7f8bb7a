"""A customer-service desk with tools: a tau2-bench-style task in miniature, offline and generated.

A customer asks about one of their orders (`user: refund 42`); the agent calls one tool per line:
`look 42` shows the order's record (`42 mug delivered 12d`: id, item, status, days since delivery,
or since the order when not delivered), `refund 42` and `cancel 42` change the database (`ok`),
and `reply <word>` answers the customer and ends the episode. The policy the agent must follow is
never stated; the reward teaches it:

- refund only a delivered order at most `refund_window_days` days after delivery;
- cancel only a placed order (not yet shipped, delivered or cancelled);
- otherwise change nothing and `reply no`; after a refund or cancel, `reply done`;
- a status question (`user: where 42`) is answered with the status word (`reply shipped`).

The tools, like a real back end, do whatever they are told: the rules are the agent's to keep, and
the request never reveals the deciding facts, so the agent has to `look` first. The reward is 1
when the final database and the reply both match the goal, 0 otherwise. A malformed call (unknown
tool, unknown order, a line not ending in `\\n`, garbage) is answered `err` with `malformed_reward`
and the episode goes on; after `max_turns` calls without a reply it is truncated.

Every refund or cancel request is an even draw between "act" and "refuse", so a policy that ignores
the record succeeds half the time. Most refused refunds are orders delivered too long ago: a policy
that reads the status but not the days succeeds on 0.6 of the refunds (0.8 at "medium", where half
the requests are cancels, decided by the status alone). The default "easy" (refunds only) therefore
leaves the widest gap, 0.6 to 1, that only the number rule closes: the skill RL has to add.

With a simulated user (`user=`, see `lit_asyncrl.envs.users`) the customer names the item, not
the order (`user: refund mug`), as tau2's customers do: the order id is on the customer's side,
and the agent gets it with a fifth tool, `ask <question>` (`ask id`), answered by the user
(`user: 42`). The customer's orders then hold distinct items, so the item names one order.
"""

from __future__ import annotations

import dataclasses
import random
import re
import string

from lit_asyncrl.envs.base import Environment, Transition
from lit_asyncrl.envs.users import CooperativeUser, Message, SimulatedUser
from lit_asyncrl.rollout.env_calls import call_blocking

#: Statuses an order starts with; `refunded` only ever results from the agent's refund.
STATUSES = ("placed", "shipped", "delivered", "cancelled")
#: Words `reply` accepts: the outcome of a refund or cancel request, or the answer to `where`.
REPLY_WORDS = ("done", "no", *STATUSES, "refunded")
ITEMS = ("mug", "hat", "pen", "cup", "bag", "toy", "box", "map")
REQUEST_KINDS = ("refund", "cancel", "where")
WRITE_TOOLS = {"refund": "refunded", "cancel": "cancelled"}  # tool -> the status it sets
ERROR = "err\n"
#: Share of the refused refund requests whose order was delivered too long ago (the number rule);
#: the rest are orders that are not delivered at all (the status rule).
TOO_OLD_SHARE = 0.8

_CALL = re.compile(r"(look|refund|cancel) ([1-9][0-9]*)\n|reply ([a-z]+)\n")
_ASK = re.compile(r"ask ([^\n]+)\n")
_REQUEST = re.compile(r"user: ([a-z]+) ([0-9]+)\n")
#: A request that names the item, not the order (with a simulated user): the agent asks for the id.
_VAGUE_REQUEST = re.compile(r"user: ([a-z]+) ([a-z]+)\n")
_USER_ANSWER = re.compile(r"user: ([0-9]+)\n")
#: Words in a question that ask for the order's id (the cooperative customer answers with it).
ID_WORDS = ("id", "number", "order", "which")
#: The longest user answer the desk passes on (a language model may ramble); the rest is cut.
MAX_USER_ANSWER_CHARS = 80
_RECORD = re.compile(r"([0-9]+) [a-z]+ ([a-z]+) ([0-9]+)d\n")


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
        want = f"to know where your {self.item} is" if self.request == "where" else f"to {self.request} your {self.item}"
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
    edge_days: int | None  # delivered orders lie within this many days of the window's edge; None = anywhere in 1..2*window


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


class ServiceDeskEpisode:
    """One conversation; it owns its copy of the database's statuses (the only mutable part)."""

    def __init__(self, instance: DeskInstance, refund_window_days: int, max_turns: int, malformed_reward: float) -> None:
        self.instance = instance
        self.max_turns = max_turns
        self.malformed_reward = malformed_reward
        self.statuses = {order.order_id: order.status for order in instance.orders}
        self.turns = 0
        requested = instance.order(instance.order_id)
        write, self.goal_reply = decide(instance.request, requested.status, requested.days, refund_window_days)
        self.goal_statuses = dict(self.statuses)
        if write is not None:
            self.goal_statuses[instance.order_id] = WRITE_TOOLS[write]

    def reset(self, seed: int | None = None) -> str:
        return f"user: {self.instance.request} {self.instance.order_id}\n"

    def step(self, action: str) -> Transition:
        self.turns += 1
        call = _CALL.fullmatch(action)
        if call is None:
            return self._continue(ERROR, self.malformed_reward, {"malformed": True})
        tool, order_id, word = call.group(1), call.group(2), call.group(3)
        if word is not None:
            if word not in REPLY_WORDS:
                return self._continue(ERROR, self.malformed_reward, {"malformed": True})
            success = word == self.goal_reply and self.statuses == self.goal_statuses
            return Transition("", float(success), terminated=True, truncated=False, info={"success": success})
        order_id = int(order_id)
        if order_id not in self.statuses:
            return self._continue(ERROR, self.malformed_reward, {"malformed": True})
        if tool == "look":
            return self._continue(self.instance.order(order_id).record(self.statuses[order_id]), 0.0)
        self.statuses[order_id] = WRITE_TOOLS[tool]
        return self._continue("ok\n", 0.0)

    def _continue(self, observation: str, reward: float, info: dict | None = None) -> Transition:
        # Out of turns without a reply: cut short, and never a success.
        return Transition(observation, reward, terminated=False, truncated=self.turns >= self.max_turns, info=info or {})


class DeskConversation(ServiceDeskEpisode):
    """A desk episode with a simulated user: the request names the item, and `ask` talks to the user.

    `step` is a coroutine (the user may be a model on another engine); the tools answer as in
    `ServiceDeskEpisode`. The user's answer comes back as one line, `user: <answer>`, cut to
    `MAX_USER_ANSWER_CHARS` printable ASCII characters (what every policy's tokenizer encodes).
    """

    def __init__(
        self, instance: DeskInstance, user: SimulatedUser, refund_window_days: int, max_turns: int, malformed_reward: float
    ) -> None:
        super().__init__(instance, refund_window_days, max_turns, malformed_reward)
        self.user = user
        self.goal = CustomerGoal(instance.request, instance.order(instance.order_id).item, instance.order_id)
        self.conversation: list[Message] = []

    def reset(self, seed: int | None = None) -> str:
        opening = f"{self.goal.request} {self.goal.item}"
        self.conversation = [Message("user", opening)]
        return f"user: {opening}\n"

    async def step(self, action: str) -> Transition:
        question = _ASK.fullmatch(action)
        if question is None:
            return super().step(action)
        self.turns += 1
        self.conversation.append(Message("agent", question.group(1)))
        answer = one_line(await self.user.reply(self.goal, list(self.conversation)))
        self.conversation.append(Message("user", answer))
        return self._continue(f"user: {answer}\n", 0.0)


def one_line(text: str) -> str:
    """`text` as the desk relays a user's answer: its first line, printable ASCII only, at most `MAX_USER_ANSWER_CHARS`."""
    printable = "".join(char if char in string.printable and char not in "\t\r\x0b\x0c" else " " for char in text)
    line = printable.strip().split("\n", 1)[0].strip()
    return line[:MAX_USER_ANSWER_CHARS] or "..."


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
            order_id, status, days = record.group(1), record.group(2), int(record.group(3))
            write, self.pending_reply = decide(self.request, status, days, self.refund_window_days)
            return f"{write} {order_id}\n" if write else f"reply {self.pending_reply}\n"
        if observation == "ok\n" and self.pending_reply is not None:
            return f"reply {self.pending_reply}\n"
        raise ValueError(f"ScriptedAgent cannot answer the observation {observation!r}")


class ServiceDeskEnv(Environment):
    """Customer-service requests about generated order databases; `demonstration` plays `ScriptedAgent`.

    Args:
        difficulty: "easy" (one order, refund requests), "medium" (two orders, refund and cancel
            requests) or "hard" (four orders, status questions too, delivery days within 5 of
            the refund window's edge).
        refund_window_days: a delivered order can be refunded up to this many days after delivery.
        malformed_reward: reward of a malformed tool call (the episode goes on).
        max_turns: tool calls per episode (at least 3: look, act, reply; 4 with a user: ask first).
        held_out_fraction: share of the instances kept for evaluation (by a hash of the instance key).
        user: a simulated customer who holds the order id (`CooperativeUser`, `LLMUser`); None =
            the request names the order itself.
        latency_s, episode_timeout_s: see `Environment`.
    """

    turn_stop = "\n"
    observation_role = "tool"
    # Chat models are told the tools' syntax, never the rules (the reward teaches those).
    system_prompt = (
        "You are a service desk agent. Each message of yours is exactly one command: `look ID` shows an "
        "order, `refund ID` refunds it, `cancel ID` cancels it, and `reply WORD` answers the customer and "
        f"ends the conversation (WORD is one of: {', '.join(REPLY_WORDS)})."
    )
    #: The longest valid call, `reply delivered\n` (16 characters); order ids have two digits.
    max_turn_tokens = max(len(f"reply {word}\n") for word in REPLY_WORDS)

    def __init__(
        self,
        difficulty: str = "easy",
        refund_window_days: int = 30,
        malformed_reward: float = -0.1,
        max_turns: int = 4,
        held_out_fraction: float = 0.2,
        user: SimulatedUser | None = None,
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(latency_s=latency_s, episode_timeout_s=episode_timeout_s)
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"env.difficulty must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}")
        if refund_window_days < 1:
            raise ValueError(f"env.refund_window_days must be >= 1, got {refund_window_days}")
        if not malformed_reward <= 0:
            raise ValueError(f"env.malformed_reward must be <= 0 (a penalty), got {malformed_reward}")
        if user is not None and not isinstance(user, SimulatedUser):
            raise TypeError(f"env.user must be a SimulatedUser (e.g. lit_asyncrl.envs.CooperativeUser) or null, got {user!r}")
        if max_turns < 3 + (user is not None):
            needed = "ask, look, act, reply" if user is not None else "look, act, reply"
            raise ValueError(f"env.max_turns must be >= {3 + (user is not None)} ({needed}), got {max_turns}")
        if not 0 < held_out_fraction < 1:
            raise ValueError(f"env.held_out_fraction must be in (0, 1), got {held_out_fraction}")
        self.difficulty = difficulty
        self.refund_window_days = refund_window_days
        self.malformed_reward = malformed_reward
        self.max_turns = max_turns
        self.held_out_fraction = held_out_fraction
        self.user = user
        self.spec = DIFFICULTIES[difficulty]
        if user is not None:
            # Questions to the user are free text (a chat model's are longer than a tool call).
            self.max_turn_tokens = max(self.max_turn_tokens, 32)
            self.system_prompt = (
                f"{self.system_prompt} The customer names only the item: `ask QUESTION` sends the customer a "
                "question (e.g. for the order ID) and shows their answer."
            )

    def generate_instance(self, rng: random.Random) -> DeskInstance:
        request = rng.choice(self.spec.requests)
        order_ids = rng.sample(range(10, 100), self.spec.num_orders)
        requested = self._requested_order(request, order_ids[0], rng)
        others = [self._random_order(order_id, rng) for order_id in order_ids[1:]]
        orders = [requested, *others]
        if self.user is not None:
            # The customer names the order by its item, so each item names one order.
            orders = [dataclasses.replace(order, item=item) for order, item in zip(orders, rng.sample(ITEMS, len(orders)))]
        orders.sort(key=lambda order: order.order_id)
        return DeskInstance(orders=tuple(orders), request=request, order_id=requested.order_id)

    def instance_key(self, instance: DeskInstance) -> str:
        records = ";".join(order.record().rstrip("\n") for order in instance.orders)
        return f"{instance.request} {instance.order_id}|{records}"

    def new_episode(self, instance: DeskInstance) -> ServiceDeskEpisode:
        return self._episode(instance, self.user)

    def _episode(self, instance: DeskInstance, user: SimulatedUser | None) -> ServiceDeskEpisode:
        if user is None:
            return ServiceDeskEpisode(instance, self.refund_window_days, self.max_turns, self.malformed_reward)
        return DeskConversation(instance, user, self.refund_window_days, self.max_turns, self.malformed_reward)

    def observation_role_of(self, observation: str) -> str:
        # With a user, the desk relays two speakers: the user's answers and the tools' results.
        return "user" if self.user is not None and observation.startswith("user: ") else self.observation_role

    def start(self) -> None:
        if self.user is not None:
            self.user.start()

    def close(self) -> None:
        if self.user is not None:
            self.user.close()

    def demonstration(self, instance: DeskInstance) -> list[tuple[str, str]]:
        # Demonstrations show a cooperative customer, whatever user the run has: they are played
        # before the run starts its user, and they show the agent's side only.
        user = None if self.user is None else CooperativeUser()
        episode, agent = self._episode(instance, user), ScriptedAgent(self.refund_window_days)
        observation, turns = episode.reset(), []
        for _ in range(self.max_turns):
            action = agent.act(observation)
            result = call_blocking(episode.step, action)
            turns.append((action, result.observation))
            if result.done:
                break
            observation = result.observation
        return turns

    def _requested_order(self, request: str, order_id: int, rng: random.Random) -> Order:
        """The order the request is about, drawn so that acting and refusing are equally likely."""
        act = rng.random() < 0.5
        if request == "refund":
            if act:
                return Order(order_id, rng.choice(ITEMS), "delivered", self._delivered_days(rng, within_window=True))
            if rng.random() < TOO_OLD_SHARE:
                return Order(order_id, rng.choice(ITEMS), "delivered", self._delivered_days(rng, within_window=False))
            return self._order_with_status(order_id, rng.choice(["placed", "shipped", "cancelled"]), rng)
        if request == "cancel":
            return self._order_with_status(order_id, "placed" if act else rng.choice(["shipped", "delivered", "cancelled"]), rng)
        return self._random_order(order_id, rng)

    def _random_order(self, order_id: int, rng: random.Random) -> Order:
        return self._order_with_status(order_id, rng.choice(STATUSES), rng)

    def _order_with_status(self, order_id: int, status: str, rng: random.Random) -> Order:
        if status == "delivered":
            days = self._delivered_days(rng, within_window=rng.random() < 0.5)
        else:
            # Ages of undelivered orders look like refundable delivery days: only the status tells them apart.
            days = rng.randint(1, self.refund_window_days)
        return Order(order_id, rng.choice(ITEMS), status, days)

    def _delivered_days(self, rng: random.Random, within_window: bool) -> int:
        window, edge = self.refund_window_days, self.spec.edge_days or self.refund_window_days
        if within_window:
            return rng.randint(max(1, window - edge + 1), window)
        return rng.randint(window + 1, window + edge)
