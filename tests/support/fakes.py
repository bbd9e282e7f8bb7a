"""Fakes of what the code under test talks to: an engine with a scripted `generate` (the `engines`
fixture makes them, and producers on them, and shuts down what still runs), and a rollout service
that records its calls. No vLLM engine is started."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lit_asyncrl.envs import GuessNumberEnv
from lit_asyncrl.rollout.engine.protocol import TurnOutput
from lit_asyncrl.rollout.episodes.formats import PlainFormat
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.queue.producer import ProducerSettings, RolloutProducer
from tests.support.tiny_policy import LETTER_A, SEMI


class FakeEngine:
    """An event loop on a daemon thread plus a scripted `generate`."""

    def __init__(self, turn) -> None:
        self.turn = turn  # async (engine, prompt_ids, on_tokens) -> TurnOutput
        self.version = 0
        self.dead: str | None = None
        self.requests: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fake-engine", daemon=True)
        self._thread.start()

    def run(self, coroutine, timeout_s=None):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    async def generate(
        self, prompt_ids, *, max_tokens, temperature, top_k=-1, stop_token_ids=(), ignore_eos=False, on_tokens=None
    ):
        self.requests.append(
            {
                "prompt": list(prompt_ids),
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_k": top_k,
                "stop": list(stop_token_ids),
            }
        )
        return await self.turn(self, prompt_ids, on_tokens)

    def dead_reason(self) -> str | None:
        return self.dead

    def shutdown(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


async def malformed_guess(engine, prompt_ids, on_tokens):
    """Writes "a;" at once: GuessNumberEnv ends the episode after this one turn (malformed_reward)."""
    ids, logprobs = [LETTER_A, SEMI], [-0.5, -0.25]
    on_tokens(ids, logprobs)
    return TurnOutput(ids, logprobs, [engine.version] * 2, "stop")


@pytest.fixture
def engines():
    """Creates fake engines and shuts down what is still running at teardown."""
    made: list[tuple[FakeEngine, list[RolloutProducer]]] = []

    class Factory:
        def engine(self, turn) -> FakeEngine:
            engine = FakeEngine(turn)
            made.append((engine, []))
            return engine

        def producer(self, engine: FakeEngine, buffer: RolloutBuffer, tokenizer, **overrides) -> RolloutProducer:
            settings = dict(
                group_size=2,
                max_concurrent_groups=4,
                sampling=SamplingSettings(temperature=1.0, top_k=-1),
                max_context=256,
                seed=0,
            )
            settings.update(overrides)
            env = settings.pop("env", None) or GuessNumberEnv()
            formats = {name: PlainFormat(tokenizer, task) for name, task in env.tasks().items()}
            producer = RolloutProducer(engine, env, formats, buffer, ProducerSettings(**settings))
            next(entry for entry in made if entry[0] is engine)[1].append(producer)
            return producer

    yield Factory()
    for engine, producers in made:
        if engine.loop.is_running():
            for producer in producers:
                producer.stop()
        engine.shutdown()


class FakeRollouts:
    """A `RolloutService` that records its calls and hands out fixed statistics."""

    max_version_gap = 3
    weight_sync_every = 1
    groups_per_batch = 2

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def use_dedicated_worker(self) -> None:
        self.calls.append(("use_dedicated_worker",))

    def launch_early(self) -> None:
        self.calls.append(("launch_early",))

    def configure(self, world_size, rank):
        return self

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass

    def start(self, weights, version, train=True):
        self.calls.append(("start", version, sorted(weights)))

    def next_batch(self, timeout_s):
        raise AssertionError("the module takes its batches from the dataloader, not from next_batch")

    def publish_weights(self, weights, version):
        self.calls.append(("publish", version, sorted(weights)))

    def live_versions(self):
        return [0]

    def pause(self) -> None:
        self.calls.append(("pause",))

    def resume(self) -> None:
        self.calls.append(("resume",))

    def score_unscored(self, score_fn, version):
        self.calls.append(("score_unscored", version))
        return 0

    def evaluate(self, instances, samples, timeout_s):
        raise AssertionError("no validation in these tests")

    def stats(self):
        self.calls.append(("stats",))
        return {"rollout/queue_depth": 7.0, "rollout/tokens_per_s": 12.5}

    def close(self) -> None:
        self.calls.append(("close",))
