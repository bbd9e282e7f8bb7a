"""An agent program's calls as exact trajectories: a call that continues the episode is spliced onto its
trajectory (the sampled ids kept as sampled), any other opens a new segment. ChatML over the tiny policy's
character tokenizer, so the expected texts are written out."""

from __future__ import annotations

import asyncio
import json

from lit_asyncrl.rollout.agent_endpoint.conversation import AgentConversation
from lit_asyncrl.rollout.engine.protocol import TurnOutput
from lit_asyncrl.rollout.episodes.for_task import episode_format_for
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory
from tests.support.chat_templates import CHATML, chat_tokenizer
from tests.support.shopping_task import ShoppingTask, add
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
ASK = {"role": "user", "content": "add a mug"}


def conversation():
    tokenizer = chat_tokenizer(CHATML)
    return tokenizer, AgentConversation(episode_format_for(tokenizer, ShoppingTask()), Trajectory(group_id=3))


def sampled(tokenizer, text: str, version: int) -> TurnOutput:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return TurnOutput(ids, [-0.5] * len(ids), [version] * len(ids), "stop")


class OneTurnEngine:
    """Streams `turn` at once and gives it back (with its versions) for one `generate`."""

    def __init__(self, turn: TurnOutput) -> None:
        self.turn = turn
        self.version = turn.versions[0]

    async def generate(self, prompt_ids, *, on_tokens, **sampling):
        on_tokens(list(self.turn.token_ids), list(self.turn.logprobs))
        return self.turn


def record(calls: AgentConversation, turn: TurnOutput):
    """Sample `turn` as the answer to the current segment; the answer as the agent reads it."""
    stop_ids = calls.episode_format.stop_token_ids
    asyncio.run(calls.sample(OneTurnEngine(turn), SamplingSettings(1.0, -1), 64, stop_ids))
    return calls.answer(turn, request_stop_ids=[])


def returned_call(item: str) -> dict:
    """The endpoint's answer as the OpenAI SDK gives it back: arguments as JSON text, with an id."""
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"item": item})}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def test_calls_that_continue_the_episode_are_one_trajectory_with_exactly_the_sampled_ids():
    tokenizer, calls = conversation()
    first = calls.prompt_ids([ASK], TOOLS)
    turn = sampled(tokenizer, add("mug") + "<|im_end|>", version=4)
    answer = record(calls, turn)
    assert [(call.name, call.arguments) for call in answer.calls] == [("add", {"item": "mug"})]
    result = {"role": "tool", "tool_call_id": "call_1", "content": "1 in the basket"}
    second = calls.prompt_ids([ASK, returned_call("mug"), result], TOOLS)
    assert second[: len(first)] == first and second[len(first) : len(first) + len(turn.token_ids)] == turn.token_ids
    appended = tokenizer.decode(second[len(first) + len(turn.token_ids) :], skip_special_tokens=False)
    assert (
        appended
        == "\n<|im_start|>user\n<tool_response>\n1 in the basket\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    done = sampled(tokenizer, "Done.<|im_end|>", version=5)
    record(calls, done)
    third = calls.prompt_ids([ASK, returned_call("mug"), result, {"role": "assistant", "content": "Done."},
                              {"role": "user", "content": "add a hat"}], TOOLS)  # fmt: skip
    (segment,) = calls.segments
    assert segment.token_ids == third and segment.group_id == 3 and segment.num_turns == 2
    policy = [token for token, mine in zip(segment.token_ids, segment.loss_mask) if mine]
    assert policy == turn.token_ids + done.token_ids  # the loss mask covers the sampled tokens only
    assert [v for v, mine in zip(segment.versions, segment.loss_mask) if mine] == [4] * len(turn.token_ids) + [5] * len(
        done.token_ids
    )
    assert [mu for mu, mine in zip(segment.behavior_logprobs, segment.loss_mask) if mine] == [-0.5] * len(policy)


def test_an_edited_history_other_tools_or_an_unusual_tail_open_new_segments():
    tokenizer, calls = conversation()
    calls.prompt_ids([ASK], TOOLS)
    record(calls, sampled(tokenizer, add("mug") + "<|im_end|>", version=0))
    result = {"role": "tool", "tool_call_id": "call_1", "content": "1 in the basket"}
    edited = {"role": "user", "content": "add two mugs"}  # the agent rewrote its opening
    calls.prompt_ids([edited, returned_call("mug"), result], TOOLS)
    assert len(calls.segments) == 2 and not any(calls.segments[1].loss_mask)  # context only, nothing sampled yet
    record(calls, sampled(tokenizer, "Done.<|im_end|>", version=1))
    history = [edited, returned_call("mug"), result, {"role": "assistant", "content": "Done."}]
    calls.prompt_ids([*history, {"role": "user", "content": "and a hat"}], TOOLS[:0])  # tools changed
    assert len(calls.segments) == 3
    record(calls, sampled(tokenizer, "Sure.<|im_end|>", version=1))
    tail = [{"role": "tool", "tool_call_id": "x", "content": "ok"}, {"role": "user", "content": "and a cup"}]
    history = [*history, {"role": "user", "content": "and a hat"}, {"role": "assistant", "content": "Sure."}]
    calls.prompt_ids([*history, *tail], TOOLS[:0])  # a tool result and a user message at once
    assert len(calls.segments) == 4
    rendered = tokenizer.decode(calls.segments[1].token_ids, skip_special_tokens=False)
    assert rendered.startswith("<|im_start|>system\n") and "<|im_start|>user\nadd two mugs<|im_end|>" in rendered
