"""What the agent endpoint costs: the same task played by the library's episode runner and by an OpenAI-SDK
agent program through the endpoint, side by side on one engine.

The task: add two digits, one more try after a wrong answer ("no"), reward 1 for a right answer. As an
`Environment` the runner plays it turn by turn; as an agent program (`two_tries` below) it is a loop over
`chat.completions.create`, every call an HTTP request to the endpoint, rendered, sampled and recorded
there. On the tiny policy both render the same tokens (plain text: the question, each answer and "no" on
lines of their own), so the difference is the endpoint's: HTTP, JSON, the SDK, a thread hop per call. On
a chat model (`--model smollm2_135m`) both go through its chat template.

Each round runs a producer of each kind in turn (the order alternates) on the tiny policy in fp32, with
32 episodes in flight and a consumer taking every group filed, for a warm-up window and then a measured
one; printed: sampled tokens and episodes per second per round, their medians and the endpoint's ratio
to the runner.

    .venv/bin/python benchmarks/bench_agent_endpoint.py            # 3 rounds of 2 x 25 s (~3 min on 2 cores)
    .venv/bin/python benchmarks/bench_agent_endpoint.py --rounds 1
    .venv/bin/python benchmarks/bench_agent_endpoint.py --model smollm2_135m --window-s 60   # a real chat model
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from typing import Any

from transformers import AutoTokenizer

from lit_asyncrl.envs.agent_program import AgentProgramEnv
from lit_asyncrl.envs.base import Environment, Transition
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.agent_endpoint.server import AgentEndpoint
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.rollout.episodes.for_task import episode_formats_for
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.queue.producer import ProducerSettings, RolloutProducer

TURN_TOKENS = 8
SAMPLING = SamplingSettings(temperature=1.0, top_k=-1)


def draw_sum(rng: random.Random) -> dict[str, int]:
    return {"a": rng.randint(0, 9), "b": rng.randint(0, 9)}


async def two_tries(client: Any, instance: dict[str, int]) -> float:
    messages = [{"role": "user", "content": f"{instance['a']}+{instance['b']}="}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=TURN_TOKENS)
        answer = reply.choices[0].message.content or ""
        if answer.strip() == str(instance["a"] + instance["b"]):
            return 1.0
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "no"}]
    return 0.0


class SumEpisode:
    def __init__(self, instance: dict[str, int]) -> None:
        self.instance = instance
        self.tries = 0

    def reset(self, seed: int | None = None) -> str:
        return f"{self.instance['a']}+{self.instance['b']}=\n"

    def step(self, action: str) -> Transition:
        self.tries += 1
        if action.strip() == str(self.instance["a"] + self.instance["b"]):
            return Transition("", 1.0, terminated=True, truncated=False, info={"success": True})
        return Transition("no\n", 0.0, terminated=self.tries >= 2, truncated=False)


class SumTask(Environment):
    """The same task for the episode runner."""

    turn_stop = "\n"
    max_turn_tokens = TURN_TOKENS
    max_turns = 2

    def generate_instance(self, rng: random.Random) -> dict[str, int]:
        return draw_sum(rng)

    def new_episode(self, instance: dict[str, int]) -> SumEpisode:
        return SumEpisode(instance)


def measure(engine: VLLMEngine, env: Environment, tokenizer, endpoint: AgentEndpoint, window_s: float) -> dict:
    """Sampled tokens and episodes per second of a producer on `env` over `window_s`, after a warm-up."""
    buffer = RolloutBuffer(capacity=256, max_version_gap=10_000)
    settings = ProducerSettings(group_size=4, max_concurrent_groups=8, sampling=SAMPLING, max_context=512, seed=0)
    producer = RolloutProducer(
        engine, env, episode_formats_for(tokenizer, env), buffer, settings, agent_endpoint=endpoint
    )
    stop = threading.Event()
    taken = {"episodes": 0}

    def consume() -> None:
        while not stop.is_set():
            groups = buffer.take(1, timeout_s=0.2) if buffer.pending else []
            taken["episodes"] += sum(len(group) for group in groups)
            time.sleep(0.01)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    producer.start()
    try:
        time.sleep(window_s / 5)  # warm-up
        tokens, episodes, started = producer.stats.policy_tokens, taken["episodes"], time.perf_counter()
        time.sleep(window_s)
        elapsed = time.perf_counter() - started
        result = {
            "tok_s": (producer.stats.policy_tokens - tokens) / elapsed,
            "episodes_s": (taken["episodes"] - episodes) / elapsed,
        }
    finally:
        producer.stop()
        stop.set()
        consumer.join()
    if producer.error is not None:
        raise producer.error
    result["dropped"] = buffer.num_dropped
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--model", default=None, help="a model folder or built-in name (default: the tiny policy)")
    args = parser.parse_args()
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    kinds = {
        "runner": SumTask(),
        "endpoint": AgentProgramEnv(two_tries, draw_sum, max_turn_tokens=TURN_TOKENS, held_out_fraction=0.0),
    }
    engine = VLLMEngine(path, EngineSettings(dtype="float32", max_model_len=512))
    endpoint = AgentEndpoint(tokenizer, SAMPLING)
    engine.start()
    endpoint.start()
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    try:
        for round_index in range(args.rounds):
            order = list(kinds) if round_index % 2 == 0 else list(reversed(kinds))
            for kind in order:
                result = measure(engine, kinds[kind], tokenizer, endpoint, args.window_s)
                results[kind].append(result)
                print(
                    f"round {round_index}: {kind:8s} {result['tok_s']:7.1f} sampled tok/s "
                    f"{result['episodes_s']:6.2f} episodes/s (dropped {result['dropped']})",
                    flush=True,
                )
    finally:
        endpoint.stop()
        engine.shutdown()
    medians = {
        kind: {key: statistics.median(r[key] for r in rows) for key in ("tok_s", "episodes_s")}
        for kind, rows in results.items()
    }
    for kind, median in medians.items():
        print(f"median {kind:8s} {median['tok_s']:7.1f} sampled tok/s {median['episodes_s']:6.2f} episodes/s")
    ratio = medians["endpoint"]["tok_s"] / medians["runner"]["tok_s"]
    print(f"endpoint / runner: {ratio:.2f}x sampled tokens per second")


if __name__ == "__main__":
    main()
