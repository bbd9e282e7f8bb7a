"""Agent programs played by the producer through the endpoint, over a fake engine and the real `openai` SDK:
64 episodes at once lose no record, each call's prompt is its trajectory so far, a multi-call episode is one
trajectory and an agent that rewrites its history files two segments with one advantage; an agent that
raises, returns no reward, outlives its timeout or disconnects mid-call is dropped with its reason (its
engine request cancelled) while the run goes on."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import subprocess
import sys
import time

import openai
import pytest

from lit_asyncrl.envs.agent_program import AgentProgramEnv, ExternalAgentEnv
from lit_asyncrl.rollout.agent_endpoint.server import AgentEndpoint
from lit_asyncrl.rollout.engine.protocol import TurnOutput
from lit_asyncrl.rollout.episodes.for_task import episode_formats_for
from lit_asyncrl.rollout.episodes.replay import committed_part
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.queue.producer import ProducerSettings, RolloutProducer
from lit_asyncrl.rollout.records import Trajectory
from tests.support.chat_templates import CHATML, chat_tokenizer
from tests.support.fakes import FakeEngine
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm

SAMPLING = SamplingSettings(temperature=1.0, top_k=-1)
CALLS = 3


class PromptLengthEngine(FakeEngine):
    """Answers every call with the length of the prompt it was sent (digits, then `<|im_end|>`), after
    `delay_s`; a prompt asking to hang waits a minute. Counts the calls in flight and those cancelled."""

    def __init__(self, tokenizer, delay_s: float = 0.05, hang_word: str | None = "hang") -> None:
        super().__init__(self._answer)
        self.tokenizer = tokenizer
        self.delay_s = delay_s
        self.hang_word = hang_word
        self.in_flight = 0
        self.most_in_flight = 0
        self.cancelled = 0

    async def _answer(self, engine, prompt_ids, on_tokens):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            hang = self.hang_word is not None and self.hang_word in self.tokenizer.decode(prompt_ids)
            await asyncio.sleep(60 if hang else self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        ids = self.tokenizer.encode(f"{len(prompt_ids)}<|im_end|>", add_special_tokens=False)
        logprobs = [-0.25] * len(ids)
        on_tokens(ids, logprobs)
        return TurnOutput(ids, logprobs, [self.version] * len(ids), "stop")


async def counting_agent(client: openai.AsyncOpenAI, instance: str) -> dict:
    """`CALLS` calls, each continuing the conversation; with instance "rewrite" the last call sends an
    edited history (a new segment). The reward is the sum of the numbers the model answered."""
    messages = [{"role": "user", "content": f"count {instance}"}]
    numbers = []
    for call in range(CALLS):
        if instance == "rewrite" and call == CALLS - 1:
            messages = [{"role": "user", "content": "count again"}, *messages[1:]]
        reply = await client.chat.completions.create(model="policy", messages=messages)
        message = reply.choices[0].message
        numbers.append(int(message.content))
        messages += [message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    return {"reward": float(sum(numbers)), "success": True}


def producer_on(engine, env, endpoint, buffer, **settings) -> RolloutProducer:
    values = dict(group_size=4, max_concurrent_groups=16, sampling=SAMPLING, max_context=4096, seed=0)
    values.update(settings)
    formats = episode_formats_for(engine.tokenizer, env)
    return RolloutProducer(engine, env, formats, buffer, ProducerSettings(**values), agent_endpoint=endpoint)


@pytest.fixture
def served():
    tokenizer = chat_tokenizer(CHATML)
    endpoint = AgentEndpoint(tokenizer, SAMPLING)
    endpoint.start()
    made = []
    yield tokenizer, endpoint, made
    for engine, producer in made:
        producer.stop()
        engine.shutdown()
    endpoint.stop()


def wait_for(condition, timeout_s: float = 60.0, message=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {message()}" if message else "timed out"
        time.sleep(0.05)


def test_64_agent_episodes_at_once_are_recorded_whole_and_exact(served):
    tokenizer, endpoint, made = served
    engine = PromptLengthEngine(tokenizer)
    draws = itertools.cycle(["plain", "plain", "plain", "rewrite"])
    env = AgentProgramEnv(counting_agent, lambda rng: next(draws), max_turn_tokens=8, held_out_fraction=0.0)
    # Room for 64 episodes in flight and what they file (a group that rewrote its history files 8 segments).
    buffer = RolloutBuffer(capacity=64 + 16 * 4, max_version_gap=100)
    producer = producer_on(engine, env, endpoint, buffer)
    made.append((engine, producer))
    producer.start()

    def filed() -> collections.Counter:
        """Segments per group filed so far (8 for a group whose episodes rewrote their history)."""
        return collections.Counter(segment.group_id for segment in buffer.pending_trajectories())

    wait_for(lambda: len(filed()) >= 16 and list(filed().values()).count(8) >= 4, 120)
    producer.stop()
    assert engine.most_in_flight >= 48, engine.most_in_flight  # the episodes really ran at the same time
    assert buffer.accounting_holds() and producer.error is None
    assert buffer.num_dropped == 0, (buffer.dropped, producer.last_env_failure)
    by_group = collections.defaultdict(list)
    for segment in buffer.pending_trajectories():
        by_group[segment.group_id].append(segment)
    groups = list(by_group.values())
    rewritten = [group for group in groups if len(group) == 8]
    assert len(groups) >= 16 and len(rewritten) >= 4
    assert producer.stats.episode_segments == 4 * len(rewritten)
    for group in groups:
        rewrite = len(group) == 8
        for segment in group:
            # Each call's prompt was the segment so far: the answer at each turn start is that start.
            answers = []
            for start in segment.turn_starts:
                end = start
                while end < len(segment.loss_mask) and segment.loss_mask[end]:
                    end += 1
                answers.append(tokenizer.decode(segment.token_ids[start:end], skip_special_tokens=False))
                assert answers[-1] == f"{start}<|im_end|>"
            sampled = [i for i, mine in enumerate(segment.loss_mask) if mine]
            assert len(sampled) == sum(len(answer) - len("<|im_end|>") + 1 for answer in answers)
            assert all(segment.behavior_logprobs[i] == -0.25 and segment.versions[i] == 0 for i in sampled)
        turns = sorted(segment.num_turns for segment in group)
        assert turns == ([1] * 4 + [CALLS - 1] * 4 if rewrite else [CALLS] * 4)
        # One advantage per episode, whatever its segments: equal rewards give 0 throughout.
        assert {segment.advantage for segment in group} == {0.0}


async def failing_agent(client: openai.AsyncOpenAI, instance: str):
    call = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hang" if instance in ("disconnect", "hang") else "hi"}]
    )
    # "disconnect" gives up on its call after 0.5 s (cancelled, as a timeout of its own would); "hang" waits
    # until the run's deadline cuts the call.
    reply = await asyncio.wait_for(call, 0.5 if instance == "disconnect" else None)
    if instance == "raise":
        raise KeyError("the agent's own bug")
    if instance == "malformed":
        return "not a reward"
    if instance == "timeout":
        await asyncio.sleep(30)
    return float(reply.choices[0].message.content)


def test_failing_agents_are_dropped_with_their_reasons_and_the_run_goes_on(served):
    tokenizer, endpoint, made = served
    engine = PromptLengthEngine(tokenizer)
    kinds = ["ok", "raise", "malformed", "timeout", "disconnect", "hang"]
    draws = itertools.cycle(kinds)
    env = AgentProgramEnv(failing_agent, lambda rng: next(draws), episode_timeout_s=2.0, held_out_fraction=0.0)
    buffer = RolloutBuffer(capacity=64, max_version_gap=100)
    producer = producer_on(engine, env, endpoint, buffer, group_size=2, max_concurrent_groups=5, env_failure_limit=1.0)
    made.append((engine, producer))
    producer.start()
    reasons = ("agent_error", "agent_malformed", "agent_timeout", "agent_disconnected")
    # "timeout" and "hang" both outlive the deadline (one after its call, one inside it): 4 episodes each.
    wait_for(
        lambda: (
            all(buffer.dropped[reason] >= 4 for reason in reasons)
            and buffer.dropped["agent_timeout"] >= 8
            and buffer.pending >= 4
        ),
        message=lambda: (buffer.counts(), producer.error, producer.last_env_failure),
    )
    producer.stop()
    assert producer.error is None and buffer.accounting_holds()
    assert set(buffer.dropped) == set(reasons) and all(count % 2 == 0 for count in buffer.dropped.values())
    assert engine.cancelled >= buffer.dropped["agent_disconnected"]  # each hung call's engine request went with it
    assert producer.stats.env_failures["agent_error"] == buffer.dropped["agent_error"]
    (group, *_) = buffer.take(1, timeout_s=1)
    assert [segment.reward for segment in group] == [float(segment.turn_starts[0]) for segment in group]


def test_an_agent_in_another_process_claims_episodes_and_posts_their_outcomes(tmp_path):
    tokenizer = chat_tokenizer(CHATML)
    connection = tmp_path / "endpoint.json"
    endpoint = AgentEndpoint(tokenizer, SAMPLING, connection_file=str(connection))
    engine = PromptLengthEngine(tokenizer)
    starts = itertools.count()
    env = ExternalAgentEnv(str(connection), lambda rng: {"start": next(starts)}, held_out_fraction=0.0)
    buffer = RolloutBuffer(capacity=16, max_version_gap=100)
    producer = producer_on(engine, env, endpoint, buffer, group_size=2, max_concurrent_groups=2)
    endpoint.start()
    agent = None
    try:
        assert connection.stat().st_mode & 0o777 == 0o600  # it holds the run's token
        assert json.loads(connection.read_text()) == {"url": endpoint.url, "token": endpoint.token}
        agent = subprocess.Popen([sys.executable, "-m", "tests.support.external_agent", str(connection)])
        producer.start()
        # Two groups: the agent plays one episode at a time, about 0.25 s each.
        wait_for(lambda: buffer.pending >= 4, message=lambda: (buffer.counts(), producer.last_env_failure))
    finally:
        if agent is not None:
            agent.kill()
            agent.wait()
        producer.stop()
        engine.shutdown()
        endpoint.stop()
    assert not connection.exists()
    assert buffer.num_dropped == 0 and buffer.accounting_holds()
    for segment in buffer.pending_trajectories():
        # Two calls in one trajectory; the outcome the agent posted: the two prompt lengths it was answered.
        assert segment.num_turns == 2 and segment.reward == float(sum(segment.turn_starts))


def test_external_episodes_that_no_agent_claims_are_dropped_naming_the_connection_file(served, tmp_path):
    tokenizer, endpoint, made = served
    engine = PromptLengthEngine(tokenizer)
    env = ExternalAgentEnv(
        str(tmp_path / "endpoint.json"), lambda rng: {"start": 0}, episode_timeout_s=0.5, held_out_fraction=0.0
    )
    buffer = RolloutBuffer(capacity=16, max_version_gap=100)
    producer = producer_on(engine, env, endpoint, buffer, group_size=2, max_concurrent_groups=2, env_failure_limit=1.0)
    made.append((engine, producer))
    producer.start()
    wait_for(lambda: buffer.dropped["agent_timeout"] >= 4)
    assert buffer.pending == 0 and engine.requests == []
    assert "no agent claimed the episode within 0.5 s" in producer.last_env_failure
    assert str(tmp_path / "endpoint.json") in producer.last_env_failure


def test_an_agent_episode_in_flight_at_a_checkpoint_is_played_again_from_its_start_after_a_resume(served):
    tokenizer, endpoint, made = served
    env = AgentProgramEnv(counting_agent, lambda rng: "hang", held_out_fraction=0.0)
    hanging = PromptLengthEngine(tokenizer)
    first = producer_on(hanging, env, endpoint, RolloutBuffer(capacity=8, max_version_gap=10), max_concurrent_groups=1)
    made.append((hanging, first))
    first.start()
    wait_for(lambda: hanging.in_flight == 4)

    async def read():
        return first.in_flight_state()

    (state,) = hanging.run(read())  # on the engine's loop, as a checkpoint reads it
    chat = [{"role": "user", "content": "count hang"}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert [episode["token_ids"] for episode in state["episodes"]] == [prompt] * 4  # the first call's prompt
    first.stop()
    assert hanging.cancelled == 4  # the calls in flight went with the stopped producer

    resumed_engine = PromptLengthEngine(tokenizer, hang_word=None)
    resumed_engine.version = 6
    buffer = RolloutBuffer(capacity=8, max_version_gap=10)
    second = producer_on(resumed_engine, env, endpoint, buffer, max_concurrent_groups=1)
    made.append((resumed_engine, second))
    second.resumed_groups = [state]
    second.start()
    wait_for(lambda: buffer.pending >= 4)
    group = buffer.take(1, timeout_s=1)[0]
    assert second.stats.resumed_episodes == 4 and {t.group_id for t in group} == {state["group_id"]}
    for trajectory in group:  # played again whole by the agent: three calls, all sampled at version 6
        assert trajectory.token_ids[: len(prompt)] == prompt and trajectory.num_turns == CALLS
        assert set(trajectory.policy_versions) == {6}


def test_a_checkpoint_keeps_no_part_of_a_finished_agent_episode_of_several_segments():
    # Its later segments are not checkpointed, so the episode is played again whole rather than kept in part.
    episode = Trajectory(group_id=3, task="agents")
    episode.extend_policy([1, 2], [-0.5, -0.5], [4, 4])
    episode.later_segments.append(Trajectory(group_id=3))
    episode.finished = True
    kept = committed_part(episode)
    assert (kept.token_ids, kept.finished, kept.group_id, kept.task) == ([], False, 3, "agents")
    single = Trajectory(group_id=3)
    single.extend_policy([1, 2], [-0.5, -0.5], [4, 4])
    single.finished = True
    assert committed_part(single).token_ids == [1, 2]  # one segment: kept whole, as any finished episode
