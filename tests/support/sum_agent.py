"""An agent program for runs on the tiny policy (`env=agent_program env.agent=tests.support.sum_agent.two_tries`):
it asks for a sum and, after a wrong answer, says so and asks again in the same conversation."""

from __future__ import annotations

import random
from typing import Any


def draw_sum(rng: random.Random) -> dict[str, int]:
    return {"a": rng.randint(0, 9), "b": rng.randint(0, 9)}


async def two_tries(client: Any, instance: dict[str, int]) -> dict[str, Any]:
    """Two calls at most, the second continuing the first; reward 1 for a right answer, else 0."""
    messages = [{"role": "user", "content": f"{instance['a']}+{instance['b']}="}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        answer = reply.choices[0].message.content or ""
        if answer.strip() == str(instance["a"] + instance["b"]):
            return {"reward": 1.0, "success": True}
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "no"}]
    return {"reward": 0.0, "success": False}
