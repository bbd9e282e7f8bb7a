"""An agent written against the OpenAI SDK, trained as it is (`experiment=agent_program`).

It asks the model to add two one-digit numbers; a wrong answer is told so and gets one more try in the
same conversation. Nothing in it knows about training: the run gives it a client bound to an episode,
and what it returns is the reward (1 for a right first answer, 0.5 for a right second one).

    lit_asyncrl.examples.arithmetic_agent.solve         the agent: async (client, instance) -> outcome
    lit_asyncrl.examples.arithmetic_agent.draw_sum      the task instances: (rng) -> {"a": .., "b": ..}
"""

from __future__ import annotations

import random
from typing import Any

from lit_asyncrl.envs.adapters.reasoning_gym import extract_answer

SYSTEM = "Reply with the final answer only."
#: Model calls per episode: the first answer and, after a wrong one, a second try.
TRIES = 2


def draw_sum(rng: random.Random) -> dict[str, int]:
    """Two one-digit numbers to add."""
    return {"a": rng.randint(0, 9), "b": rng.randint(0, 9)}


async def solve(client: Any, instance: dict[str, int]) -> dict[str, Any]:
    """Ask for the sum; after a wrong answer, say so and ask again (one conversation, `TRIES` calls)."""
    total = instance["a"] + instance["b"]
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is {instance['a']} + {instance['b']}? Answer with a number."},
    ]
    for attempt in range(TRIES):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=12)
        answer = reply.choices[0].message.content or ""
        if extract_answer(answer, "", "last_number") == str(total):
            return {"reward": 1.0 / (attempt + 1), "success": attempt == 0}
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": "That is not right. Answer again with a number."})
    return {"reward": 0.0, "success": False}
