"""Simulated users on the real engine: a customer played by a model on a vLLM engine of its own.

The desk with a cooperative customer learning to ask is checked in the task mixture's run
(`test_scale_out.py`), one of whose tasks it is."""

from __future__ import annotations

import re

import psutil
import pytest
import torch

from lit_asyncrl.envs import LLMUser, ServiceDeskEnv
from lit_asyncrl.envs.service_desk.episode import one_line
from lit_asyncrl.warm_start import WarmStart, load_tokenizer
from tests.support.small_engines import small_async_service

pytestmark = pytest.mark.engine


class RecordingLLMUser(LLMUser):
    """An `LLMUser` that keeps every answer its model wrote."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.answers: list[str] = []

    async def reply(self, goal, conversation):
        answer = await super().reply(goal, conversation)
        self.answers.append(answer)
        return answer


def engine_cores() -> list[psutil.Process]:
    """This process's live vLLM engine-core processes (an exited one not yet waited for counts as gone)."""
    cores = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "VLLM::EngineCore" in " ".join(child.cmdline()):
                cores.append(child)
        except psutil.Error:  # gone meanwhile
            continue
    return cores


def test_a_customer_played_by_a_model_answers_from_its_own_frozen_engine(tiny_model_path):
    from transformers import AutoModelForCausalLM

    # The customer is a second tiny model; the agent is the tiny policy, warm-started to ask first.
    user = RecordingLLMUser(model="tiny", max_reply_tokens=6, temperature=1.0, max_model_len=384)
    env = ServiceDeskEnv(user=user, max_turns=5)
    tokenizer = load_tokenizer(str(tiny_model_path))
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path).train()
    WarmStart(steps=40, lr=3e-3, batch_size=32).run(
        policy, env, tokenizer, accelerator="cpu", enable_progress_bar=False
    )
    assert user.engine is None  # the warm start plays the cooperative customer, not the model
    service = small_async_service(tiny_model_path, env)
    weights = {name: tensor.detach().clone() for name, tensor in policy.state_dict().items()}
    try:
        service.start(weights, version=0)
        assert len(engine_cores()) == 2  # the policy's engine and the customer's
        batch = service.next_batch(timeout_s=180)
        service.publish_weights(weights, version=1)
        # Only the policy's engine takes new versions; the customer's weights never change.
        assert (service.engine.version, user.engine.version) == (1, 0)
    finally:
        service.close()
    assert user.engine is None and engine_cores() == []
    assert user.answers, "no episode asked the customer"
    # What the model wrote, cut to one printable line, is what the agent read, as context only.
    lines = {one_line(answer) for answer in user.answers}
    relayed = 0
    for ids, mask in zip(batch["input_ids"], batch["loss_mask"]):
        # One character per token (special tokens as one placeholder), so text offsets are token offsets.
        text = "".join(token if len(token) == 1 else "\x00" for token in tokenizer.convert_ids_to_tokens(ids.tolist()))
        for line in lines:
            for match in re.finditer(re.escape(f"\nuser: {line}\n"), text):
                relayed += 1
                assert not mask[match.start() + 1 : match.end()].any()
    assert relayed > 0
    assert torch.isfinite(batch["behavior_logprobs"][batch["loss_mask"]]).all()
