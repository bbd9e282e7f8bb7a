"""Tool tasks as tokens (`rollout/episodes/tool_calls.py`): every rendering written out here as text.

Tokenizers: the tiny policy's character tokenizer (the compact rendering), and the same with ChatML's
special tokens and either a ChatML template that ignores `tools=` (the Hermes fallback, as SmolLM2's)
or a template that renders tools itself (as Qwen2.5's does).
"""

from __future__ import annotations

import pytest

from lit_asyncrl.envs.service_desk.orders import DeskInstance, Order
from lit_asyncrl.envs.service_desk.tools_task import ServiceDeskToolsEnv
from lit_asyncrl.envs.tools import AssistantTurn, ToolCall, ToolMessage
from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.for_task import episode_format_for
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_episode
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.episodes.tool_calls import ChatToolFormat, CompactToolFormat, hermes_tools_prompt
from lit_asyncrl.rollout.records import Trajectory
from tests.support.chat_templates import CHATML, TOOLS_TEMPLATE, chat_tokenizer
from tests.support.scripted_engine import scripted_engine
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm

INSTANCE = DeskInstance(orders=(Order(42, "mug", "delivered", 12),), request="refund", order_id=42)
LOOK = AssistantTurn("", (ToolCall("look", {"order_id": 42}),))
ANSWERS = [ToolMessage("42 mug delivered 12d", "look"), ToolMessage("ok", "refund")]


def play(engine, env, episode_format, instance) -> Trajectory:
    """One episode; a character per token, the schemas alone take 1,400 positions."""
    caller = EnvCaller(max_workers=1)
    try:
        settings = EpisodeSettings(
            call_env=caller, sampling=SamplingSettings(temperature=1.0, top_k=-1), max_context=4096
        )
        return engine.run(
            play_episode(engine, env, episode_format, instance, Trajectory(group_id=0), settings), timeout_s=30
        )
    finally:
        caller.close()
        engine.shutdown()


def text(tokenizer, trajectory: Trajectory) -> str:
    return tokenizer.decode(trajectory.token_ids, skip_special_tokens=False)


def opened(episode_format, env) -> Trajectory:
    trajectory = Trajectory(group_id=0)
    episode_format.open(trajectory, env.new_episode(INSTANCE).reset())
    return trajectory


def test_the_compact_rendering_for_plain_text_policies():
    tokenizer, env = build_char_tokenizer(), ServiceDeskToolsEnv()
    episode_format = episode_format_for(tokenizer, env)
    assert isinstance(episode_format, CompactToolFormat)
    trajectory = opened(episode_format, env)
    assert text(tokenizer, trajectory) == "<bos>refund order 42\n"  # no schemas: learnt from demonstrations
    episode_format.add_observation(trajectory, ANSWERS)
    assert text(tokenizer, trajectory) == "<bos>refund order 42\n42 mug delivered 12d\nok\n"
    demonstrated = episode_format.demonstrated_turn_ids(LOOK)
    assert tokenizer.decode(demonstrated) == '<tool_call>{"name":"look","arguments":{"order_id":42}}</tool_call>\n'
    action = episode_format.action(demonstrated)
    assert (action.content, [(call.name, call.arguments) for call in action.calls]) == (
        "",
        [("look", {"order_id": 42})],
    )
    with pytest.raises(ValueError, match="env.tool_parser='llama3_json': a policy without a chat template"):
        episode_format_for(tokenizer, ServiceDeskToolsEnv(tool_parser="llama3_json"))


def assert_a_hermes_call_then_two_answers(tokenizer, episode_format, trajectory: Trajectory) -> None:
    """The demonstrated `look` call and two answers after it, as both chat renderings write them
    (the tools template mimics Qwen2.5's, which the Hermes fallback follows)."""
    demonstrated = episode_format.demonstrated_turn_ids(LOOK)
    assert (
        tokenizer.decode(demonstrated)
        == '<tool_call>\n{"name": "look", "arguments": {"order_id": 42}}\n</tool_call><|im_end|>'
    )
    trajectory.extend_policy(demonstrated, [0.0] * len(demonstrated), [0] * len(demonstrated))
    before = len(trajectory.token_ids)
    episode_format.add_observation(trajectory, ANSWERS)
    assert tokenizer.decode(trajectory.token_ids[before:]) == (
        "\n<|im_start|>user\n<tool_response>\n42 mug delivered 12d\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_hermes_fallback_for_templates_without_tools():
    tokenizer, env = chat_tokenizer(CHATML), ServiceDeskToolsEnv()
    episode_format = episode_format_for(tokenizer, env)
    assert isinstance(episode_format, ChatToolFormat) and not episode_format.template_renders_tools
    schemas = [tool.schema for tool in env.new_episode(INSTANCE).tools.values()]
    assert hermes_tools_prompt(schemas[:1]) == (
        "You can call these tools, given as JSON schemas:\n<tools>\n"
        '{"type": "function", "function": {"name": "look", "description": "Show an order\'s record: its id, item, status, and days since '
        'delivery (since the order when not delivered).", "parameters": {"type": "object", "properties": {"order_id": {"type": "integer", '
        '"description": "The order\'s number."}}, "required": ["order_id"]}, "return": {"type": "string"}}}\n'
        "</tools>\n"
        'To call a tool, write <tool_call>\n{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n</tool_call>; '
        "write one such block per call. The results come back in <tool_response></tool_response> blocks."
    )
    trajectory = opened(episode_format, env)
    assert text(tokenizer, trajectory) == (
        f"<|im_start|>system\n{env.system_prompt}\n\n{hermes_tools_prompt(schemas)}<|im_end|>\n"
        "<|im_start|>user\nrefund order 42<|im_end|>\n<|im_start|>assistant\n"
    )
    assert_a_hermes_call_then_two_answers(tokenizer, episode_format, trajectory)


def test_a_template_that_renders_tools_renders_schemas_calls_and_answers_itself():
    tokenizer, env = chat_tokenizer(TOOLS_TEMPLATE), ServiceDeskToolsEnv()
    episode_format = episode_format_for(tokenizer, env)
    assert episode_format.template_renders_tools
    trajectory = opened(episode_format, env)
    assert text(tokenizer, trajectory) == (
        f"<|im_start|>system\n{env.system_prompt}\nTOOLS: look refund cancel reply<|im_end|>\n"
        "<|im_start|>user\nrefund order 42<|im_end|>\n<|im_start|>assistant\n"
    )
    assert_a_hermes_call_then_two_answers(tokenizer, episode_format, trajectory)


def test_a_played_tool_episode_trains_on_exactly_the_ids_the_engine_saw():
    # The engine writes three turns (look, refund, reply) as a model would; the episode runner
    # parses them, runs the tools and appends their answers: every request's prompt is the
    # trajectory so far, and the policy mask covers exactly the engine's tokens.
    tokenizer, env = chat_tokenizer(CHATML), ServiceDeskToolsEnv()
    turns = [
        '<tool_call>\n{"name": "look", "arguments": {"order_id": 42}}\n</tool_call><|im_end|>',
        '<tool_call>\n{"name": "refund", "arguments": {"order_id": 42}}\n</tool_call><|im_end|>',
        '<tool_call>\n{"name": "reply", "arguments": {"message": "done"}}\n</tool_call><|im_end|>',
    ]
    engine = scripted_engine(tokenizer, turns)
    trajectory = play(engine, env, episode_format_for(tokenizer, env), INSTANCE)
    assert trajectory.env_failure is None, trajectory.env_failure_message
    assert (trajectory.reward, trajectory.success, trajectory.num_turns) == (1.0, True, 3)
    assert dict(trajectory.tool_calls) == {"look": 1, "refund": 1, "reply": 1} and not trajectory.tool_call_errors
    policy = tokenizer.decode(
        [token for token, mine in zip(trajectory.token_ids, trajectory.loss_mask) if mine], skip_special_tokens=False
    )
    assert policy == "".join(turns)
    for request in engine.requests:
        assert trajectory.token_ids[: len(request["prompt"])] == request["prompt"]
    assert text(tokenizer, trajectory).endswith(
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n" + turns[2]
    )
