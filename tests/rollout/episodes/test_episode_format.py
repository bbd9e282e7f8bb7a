"""Episode formats: raw text for the tiny policy, incremental chat-template rendering for chat models.

The chat tokenizer here is the tiny policy's character tokenizer plus ChatML's two special tokens
and a ChatML template, so every expected token list below is written out by hand as text.
"""

from __future__ import annotations

import json
import random

import pytest

from lit_asyncrl.envs import DatasetEnv, GuessNumberEnv, ServiceDeskEnv
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.for_task import episode_format_for
from lit_asyncrl.rollout.episodes.formats import ChatTemplateFormat, PlainFormat
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_episode
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.text import pad_token_id
from lit_asyncrl.warm_start import demonstration_trajectories
from tests.support.chat_templates import CHATML, chat_tokenizer
from tests.support.fakes import FakeEngine
from tests.support.scripted_engine import ids, scripted_engine
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm

# Like Llama-2's: only user and assistant roles, anything else raises.
USER_AND_ASSISTANT_ONLY = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Re-renders history: earlier assistant messages are dropped once a newer user message exists.
NOT_INCREMENTAL = (
    "{% for message in messages %}"
    "{% if message['role'] != 'assistant' or loop.last %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chat():
    return chat_tokenizer()


def play(engine: FakeEngine, env, episode_format, instance) -> Trajectory:
    caller = EnvCaller(max_workers=1)
    try:
        settings = EpisodeSettings(
            call_env=caller, sampling=SamplingSettings(temperature=1.0, top_k=-1), max_context=512
        )
        coroutine = play_episode(engine, env, episode_format, instance, Trajectory(group_id=0), settings)
        return engine.run(coroutine, timeout_s=30)
    finally:
        caller.close()
        engine.shutdown()


def test_a_chat_episode_is_the_template_rendered_turn_by_turn(chat):
    env = GuessNumberEnv()  # secret 7: guesses 3 (H) then 7 (W)
    engine = scripted_engine(chat, ["3;<|im_end|>", "7;<|im_end|>"])
    trajectory = play(engine, env, episode_format_for(chat, env), 7)

    first_prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n?<|im_end|>\n<|im_start|>assistant\n"
    second_prompt = first_prompt + "3;<|im_end|>\n<|im_start|>user\nH<|im_end|>\n<|im_start|>assistant\n"
    assert [request["prompt"] for request in engine.requests] == [ids(chat, first_prompt), ids(chat, second_prompt)]
    assert trajectory.token_ids == ids(chat, second_prompt + "7;<|im_end|>")
    # Policy tokens are exactly the two turns, each with its end-of-turn token.
    policy = [token for token, mask in zip(trajectory.token_ids, trajectory.loss_mask) if mask]
    assert policy == ids(chat, "3;<|im_end|>") + ids(chat, "7;<|im_end|>")
    assert trajectory.success and trajectory.num_turns == 2
    # The turn ends at <|im_end|> (and EOS), not at the task's ";".
    assert engine.requests[0]["stop"] == [chat.convert_tokens_to_ids("<|im_end|>"), chat.eos_token_id]
    # Rendering the whole conversation at once gives the same ids (the template is incremental).
    messages = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": "3;"},
        {"role": "user", "content": "H"},
        {"role": "assistant", "content": "7;"},
    ]
    whole = chat.apply_chat_template(messages, tokenize=False)
    assert trajectory.token_ids == ids(chat, whole.removesuffix("\n"))


def test_a_turn_cut_short_is_closed_before_the_next_message(chat):
    env = GuessNumberEnv()
    engine = scripted_engine(chat, ["3;", "7;<|im_end|>"])  # the first turn hit its token limit
    trajectory = play(engine, env, ChatTemplateFormat(chat, env), 7)
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n?<|im_end|>\n<|im_start|>assistant\n"
        "3;<|im_end|>\n<|im_start|>user\nH<|im_end|>\n<|im_start|>assistant\n7;<|im_end|>"
    )
    assert trajectory.token_ids == ids(chat, expected)
    im_end = chat.convert_tokens_to_ids("<|im_end|>")
    first_close = trajectory.token_ids.index(im_end, len(ids(chat, expected.split("3;")[0])))
    assert not trajectory.loss_mask[first_close]  # the closing token was not sampled: context, not trained


def test_the_environment_receives_its_own_turn_format(chat):
    env = GuessNumberEnv()
    chat_format, plain_format = ChatTemplateFormat(chat, env), PlainFormat(chat, env)
    assert chat_format.action(ids(chat, "3;<|im_end|>")) == "3;"
    assert chat_format.action(ids(chat, "3")) == "3;"  # cut short: the stop text is added
    assert plain_format.action(ids(chat, "3;")) == "3;"
    assert plain_format.stop_token_ids == [ids(chat, ";")[0], chat.eos_token_id]


def test_tool_answers_use_the_tool_role_where_the_template_has_one():
    env = ServiceDeskEnv()
    with_tool = ChatTemplateFormat(chat_tokenizer(CHATML), env)
    without_tool = ChatTemplateFormat(chat_tokenizer(USER_AND_ASSISTANT_ONLY), env)
    assert (with_tool.observation_role, without_tool.observation_role) == ("tool", "user")
    trajectory = Trajectory(group_id=0)
    with_tool.open(trajectory, "user: refund 12\n")
    trajectory.extend_policy(ids(with_tool.tokenizer, "look 12<|im_end|>"), [0.0] * 8, [0] * 8)
    with_tool.add_observation(trajectory, "12 mug delivered 3d\n")
    text = with_tool.tokenizer.decode(trajectory.token_ids)
    assert text == (
        f"<|im_start|>system\n{env.system_prompt}<|im_end|>\n<|im_start|>user\nuser: refund 12\n<|im_end|>\n"
        "<|im_start|>assistant\nlook 12<|im_end|>\n<|im_start|>tool\n12 mug delivered 3d\n<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_that_re_renders_history_is_refused():
    with pytest.raises(ValueError, match="incrementally"):
        ChatTemplateFormat(chat_tokenizer(NOT_INCREMENTAL), GuessNumberEnv())


def test_the_format_follows_the_tokenizer(chat, tokenizer):
    assert isinstance(episode_format_for(chat, GuessNumberEnv()), ChatTemplateFormat)
    assert isinstance(episode_format_for(tokenizer, GuessNumberEnv()), PlainFormat)
    with pytest.raises(ValueError, match="env.turn_stop"):
        bad = GuessNumberEnv()
        bad.turn_stop = "ab"
        PlainFormat(tokenizer, bad)


def test_demonstrations_have_the_played_layout(chat):
    env = GuessNumberEnv()
    (trajectory,) = demonstration_trajectories(env, {None: ChatTemplateFormat(chat, env)}, 1, random.Random(0))
    text = chat.decode(trajectory.token_ids)
    policy = chat.decode([token for token, mask in zip(trajectory.token_ids, trajectory.loss_mask) if mask])
    assert text.startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not text.endswith("W<|im_end|>\n<|im_start|>assistant\n")  # the last answer is never shown
    # Demonstrated turns are the bare guesses (the task's ";" is its raw-text stop) closed by <|im_end|>.
    turns = policy.split("<|im_end|>")
    assert turns[-1] == "" and all(turn.isdigit() for turn in turns[:-1]) and len(turns) >= 2


def test_pad_falls_back_to_eos(chat):
    assert pad_token_id(chat) == chat.pad_token_id
    chat_without_pad = chat_tokenizer()
    chat_without_pad.pad_token = None
    assert pad_token_id(chat_without_pad) == chat_without_pad.eos_token_id


def test_a_datasets_chat_messages_open_the_episode_as_the_template_renders_them(chat, tmp_path):
    messages = [{"role": "system", "content": "Answer in tags."}, {"role": "user", "content": "2+2?"}]
    (tmp_path / "rows.jsonl").write_text(
        json.dumps({"prompt": messages, "answer": "4", "split": "train"})
        + "\n"
        + json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2", "split": "test"})
        + "\n"
    )
    rewards = ["exact_match", "tests.support.reward_functions.format_reward_func"]
    env = DatasetEnv(str(tmp_path / "rows.jsonl"), split_key="split", rewards=rewards)
    engine = scripted_engine(chat, ["<think>2+2</think><answer>4</answer><|im_end|>"])
    trajectory = play(engine, env, episode_format_for(chat, env), 0)
    env.close()
    rendered = chat.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert engine.requests[0]["prompt"] == ids(chat, rendered)
    # The completion reaches the functions as TRL's conversational one: a list with the assistant message.
    # exact_match reads its content (not "4": 0.0); TRL's format function matches the tags (1.0).
    assert trajectory.reward == 1.0 and trajectory.success  # the reward reaches env.success_reward (1.0)
    assert trajectory.reward_terms == {"exact_match": 0.0, "tests.support.reward_functions.format_reward_func": 1.0}


def test_a_model_without_a_chat_template_refuses_chat_messages_naming_the_task(tokenizer, tmp_path):
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}?"}], "answer": "x"}) + "\n" for a in range(30))
    )
    env = DatasetEnv(str(tmp_path / "rows.jsonl"))
    engine = scripted_engine(tokenizer, ["x\n"])
    trajectory = play(engine, env, episode_format_for(tokenizer, env), 0)
    env.close()
    assert trajectory.env_failure == "env_malformed"  # dropped with its counted reason
    assert trajectory.env_failure_message.startswith("DatasetEnv: observations must be str, got [{'role': 'user'")
