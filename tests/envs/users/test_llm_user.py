"""The language-model user's settings and prompt (its engine runs in tests/integration/test_simulated_users.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lit_asyncrl.envs import LLMUser
from lit_asyncrl.envs.service_desk.orders import CustomerGoal
from lit_asyncrl.envs.users.llm_user import user_prompt_ids
from lit_asyncrl.envs.users.simulated import Message
from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
from tests.support.chat_templates import CHATML, chat_tokenizer
from tests.support.scripted_engine import scripted_engine

CONVERSATION = [Message("user", "refund mug"), Message("agent", "your order id?")]


def test_with_a_chat_template_the_model_plays_the_customer_as_the_assistant():
    tokenizer = chat_tokenizer(CHATML)
    prompt = tokenizer.decode(user_prompt_ids(tokenizer, "You want a refund.", CONVERSATION))
    assert prompt == (
        "<|im_start|>system\nYou want a refund.<|im_end|>\n<|im_start|>assistant\nrefund mug<|im_end|>\n"
        "<|im_start|>user\nyour order id?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_without_a_chat_template_the_prompt_is_a_transcript():
    tokenizer = build_char_tokenizer()
    prompt = tokenizer.decode(user_prompt_ids(tokenizer, "You want a refund.", CONVERSATION))
    assert prompt == "You want a refund.\nCustomer: refund mug\nAgent: your order id?\nCustomer:"


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"max_reply_tokens": 0}, "env.user.max_reply_tokens"),
        ({"temperature": -0.5}, "env.user.temperature"),
        ({"dtype": "int8"}, "env.user.dtype"),
        ({"max_model_len": 24}, "env.user.max_model_len"),
        ({"kv_cache_gib": 0}, "env.user.kv_cache_gib"),
    ],
)
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        LLMUser(**kwargs)


def test_a_reply_before_the_start_says_who_starts_the_user():
    with pytest.raises(RuntimeError, match="before LLMUser.start"):
        asyncio.run(LLMUser().reply(CustomerGoal("refund", "mug", 42), CONVERSATION))
    LLMUser().close()  # closing a user never started is a no-op


def test_the_user_runs_on_the_engine_the_runner_makes_for_its_model_and_stops_it():
    made, stopped = [], []

    class Engine:
        def shutdown(self):
            stopped.append(True)

    def make_engine(model):
        made.append(model)
        return Engine()

    user = LLMUser(model="tiny", dtype="bfloat16", max_model_len=300, kv_cache_gib=0.5, seed=7)
    with pytest.raises(ValueError, match="make_engine"):
        user.start()  # envs start no engine themselves
    user.start(make_engine)
    user.start(make_engine)  # started once
    (model,) = made
    assert (model.dtype, model.max_model_len, model.kv_cache_bytes, model.seed) == ("bfloat16", 300, 2**29, 7)
    assert (Path(model.path) / "config.json").is_file()  # `tiny` resolved to its model folder
    user.close()
    user.close()
    assert stopped == [True] and user.engine is None


def test_a_reply_holding_an_end_marker_ends_the_conversation():
    # The engine's turns are scripted (text of the tiny policy's character tokenizer).
    user = LLMUser(model="tiny", max_model_len=300, end_markers=["###STOP###", "###TRANSFER###"])
    user.start(lambda model: scripted_engine(build_char_tokenizer(), ["it is 42", "thanks ###STOP###"]))
    try:
        goal = CustomerGoal("refund", "mug", 42)
        assert asyncio.run(user.reply(goal, CONVERSATION)) == "it is 42"
        assert asyncio.run(user.reply(goal, CONVERSATION)) is None  # tau2's user says it is done
    finally:
        user.close()
    with pytest.raises(ValueError, match=r"^env.user.end_markers must be a list of non-blank strings"):
        LLMUser(end_markers="###STOP###")
