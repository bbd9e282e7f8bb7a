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

With a simulated user (`user=`, see `lit_asyncrl.envs.users.simulated`) the customer names the item, not
the order (`user: refund mug`), as tau2's customers do: the order id is on the customer's side,
and the agent gets it with a fifth tool, `ask <question>` (`ask id`), answered by the user
(`user: 42`). The customer's orders then hold distinct items, so the item names one order.
"""

from __future__ import annotations

import dataclasses
import random

from lit_asyncrl.envs.base import Environment, call_blocking
from lit_asyncrl.envs.resources import EngineMaker
from lit_asyncrl.envs.service_desk.agent import ScriptedAgent
from lit_asyncrl.envs.service_desk.episode import DeskConversation, ServiceDeskEpisode
from lit_asyncrl.envs.service_desk.orders import (
    DIFFICULTIES,
    ITEMS,
    REPLY_WORDS,
    STATUSES,
    TOO_OLD_SHARE,
    DeskInstance,
    Order,
)
from lit_asyncrl.envs.users.simulated import CooperativeUser, SimulatedUser


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
            raise TypeError(
                f"env.user must be a SimulatedUser (e.g. lit_asyncrl.envs.CooperativeUser) or null, got {user!r}"
            )
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
            orders = [
                dataclasses.replace(order, item=item) for order, item in zip(orders, rng.sample(ITEMS, len(orders)))
            ]
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

    def start(self, make_engine: EngineMaker | None = None) -> None:
        if self.user is not None:
            self.user.start(make_engine)

    def close(self) -> None:
        if self.user is not None:
            self.user.close()

    def demonstration(self, instance: DeskInstance) -> list[tuple[str, str]]:
        # Demonstrations show a cooperative customer, whatever user the run has: they are played
        # before the run starts its user, and they show the agent's side only.
        user = None if self.user is None else CooperativeUser()
        episode = self._episode(instance, user)
        agent = ScriptedAgent(self.refund_window_days)
        observation = episode.reset()
        turns = []
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
            return self._order_with_status(
                order_id, "placed" if act else rng.choice(["shipped", "delivered", "cancelled"]), rng
            )
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
        window = self.refund_window_days
        edge = self.spec.edge_days or self.refund_window_days
        if within_window:
            return rng.randint(max(1, window - edge + 1), window)
        return rng.randint(window + 1, window + edge)
