"""The agent endpoint over a scripted engine, called with the real `openai` SDK: an agent loop that runs its
own tool calls is recorded as one exact trajectory; requests without the run's token or with other sampling
settings are refused; the server listens on loopback only and is gone after `stop`."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading

import httpx
import openai
import psutil
import pytest

from lit_asyncrl.rollout.agent_endpoint.conversation import AgentConversation
from lit_asyncrl.rollout.agent_endpoint.server import AgentEndpoint, AgentEpisode
from lit_asyncrl.rollout.episodes.for_task import episode_format_for
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory
from tests.support.chat_templates import CHATML, chat_tokenizer
from tests.support.fakes import FakeEngine
from tests.support.scripted_engine import scripted_engine
from tests.support.shopping_task import ADD_SCHEMA, ShoppingTask, add
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm

TOOLS = [ADD_SCHEMA]
TURNS = [add("mug") + "<|im_end|>", "Your mug is in.<|im_end|>"]


SAMPLING = SamplingSettings(temperature=0.7, top_k=-1)


def open_episode(served: AgentEndpoint, engine, tokenizer, group_id: int, max_context: int = 8192):
    """A new episode of the shopping task on `engine`: (its episode, the base URL for its agent)."""
    conversation = AgentConversation(episode_format_for(tokenizer, ShoppingTask()), Trajectory(group_id=group_id))
    episode = AgentEpisode(conversation, engine, SAMPLING, max_turn_tokens=128, max_context=max_context)
    return episode, served.open_episode(episode)


@pytest.fixture
def endpoint():
    tokenizer = chat_tokenizer(CHATML)
    engine = scripted_engine(tokenizer, TURNS)
    served = AgentEndpoint(tokenizer, SAMPLING)
    served.start()
    yield tokenizer, engine, served
    served.stop()
    engine.shutdown()


def agent(client: openai.OpenAI) -> list[str]:
    """A tool-using agent as a user writes one: call the model until it answers without a call."""
    basket: list[str] = []
    messages = [{"role": "user", "content": "add a mug"}]
    while True:
        reply = client.chat.completions.create(model="anything", messages=messages, tools=TOOLS, temperature=0.7)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return basket + [message.content]
        for call in message.tool_calls:
            basket.append(json.loads(call.function.arguments)["item"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{len(basket)} in the basket"})


def test_an_agent_loop_is_recorded_as_one_trajectory_of_exactly_the_engines_ids(endpoint):
    tokenizer, engine, served = endpoint
    episode, url = open_episode(served, engine, tokenizer, group_id=7)
    assert url.startswith(f"http://127.0.0.1:{served.port}/episodes/")
    assert agent(openai.OpenAI(base_url=url, api_key=served.token)) == ["mug", "Your mug is in."]
    served.close_episode(episode)
    (segment,) = episode.conversation.segments
    assert segment.group_id == 7 and segment.num_turns == 2
    policy = [token for token, mine in zip(segment.token_ids, segment.loss_mask) if mine]
    assert tokenizer.decode(policy, skip_special_tokens=False) == "".join(TURNS)
    first, second = engine.requests
    assert segment.token_ids[: len(second["prompt"])] == second["prompt"]  # the second call continued the first
    assert second["prompt"][: len(first["prompt"])] == first["prompt"]
    assert (first["temperature"], first["top_k"], first["max_tokens"]) == (0.7, -1, 128)


def streaming_agent(client: openai.OpenAI) -> tuple[list[str], list[dict]]:
    """The same agent reading streamed answers as clients do (deltas joined); also the usage chunks."""
    basket: list[str] = []
    usages = []
    messages = [{"role": "user", "content": "add a mug"}]
    while True:
        content, calls = "", {}
        stream = client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            if chunk.usage is not None:
                usages.append(chunk.usage.model_dump())
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    calls[call.index] = call
        message = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": c.function.model_dump()} for c in calls.values()
            ]
        messages.append(message)
        if not calls:
            return basket + [content], usages
        for call in calls.values():
            basket.append(json.loads(call.function.arguments)["item"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{len(basket)} in the basket"})


def test_a_streaming_agent_reads_the_same_answers_and_is_recorded_the_same_way(endpoint):
    tokenizer, engine, served = endpoint
    episode, url = open_episode(served, engine, tokenizer, group_id=7)
    basket, usages = streaming_agent(openai.OpenAI(base_url=url, api_key=served.token, max_retries=0))
    assert basket == ["mug", "Your mug is in."]
    served.close_episode(episode)
    (segment,) = episode.conversation.segments  # the second call continued the first, as without streaming
    policy = [token for token, mine in zip(segment.token_ids, segment.loss_mask) if mine]
    assert tokenizer.decode(policy, skip_special_tokens=False) == "".join(TURNS)
    first, second = engine.requests
    lengths = [len(tokenizer.encode(turn, add_special_tokens=False)) for turn in TURNS]
    assert [usage["prompt_tokens"] for usage in usages] == [len(first["prompt"]), len(second["prompt"])]
    assert [usage["completion_tokens"] for usage in usages] == lengths


def test_a_single_token_stop_string_ends_the_answer_there_and_longer_ones_are_refused():
    tokenizer = chat_tokenizer(CHATML)
    engine = scripted_engine(tokenizer, ["Yes."])  # the engine stopped at the request's stop token
    served = AgentEndpoint(tokenizer, SAMPLING)
    served.start()
    try:
        _, url = open_episode(served, engine, tokenizer, group_id=0)
        client = openai.OpenAI(base_url=url, api_key=served.token, max_retries=0)
        ask = [{"role": "user", "content": "ok?"}]
        with pytest.raises(openai.BadRequestError, match=r"stop='END' is 3 tokens"):
            client.chat.completions.create(model="m", messages=ask, stop=["END"])
        reply = client.chat.completions.create(model="m", messages=ask, stop=["."])
        (request,) = engine.requests
        dot = tokenizer.encode(".", add_special_tokens=False)
        assert request["stop"][-1:] == dot  # the engine stops at it, beside the template's own stops
        assert reply.choices[0].message.content == "Yes"  # left out of the answer, as OpenAI does
    finally:
        served.stop()
        engine.shutdown()


def test_requests_without_the_token_or_with_other_sampling_are_refused(endpoint):
    tokenizer, engine, served = endpoint
    _, url = open_episode(served, engine, tokenizer, group_id=0)
    ask = [{"role": "user", "content": "add a mug"}]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="not-the-token").chat.completions.create(model="m", messages=ask)
    client = openai.OpenAI(base_url=url, api_key=served.token, max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"temperature=0.2 differs from the run's 0.7"):
        client.chat.completions.create(model="m", messages=ask, temperature=0.2)
    with pytest.raises(openai.BadRequestError, match=r"n=2 is not served"):
        client.chat.completions.create(model="m", messages=ask, n=2)
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(
            base_url=url.replace("/episodes/", "/episodes/x"), api_key=served.token, max_retries=0
        ).chat.completions.create(model="m", messages=ask)
    headers = {"Authorization": f"Bearer {served.token}"}
    malformed = httpx.post(f"{url}/chat/completions", headers=headers, json={"messages": ask, "tools": ["add"]})
    assert malformed.status_code == 400 and "malformed request" in malformed.json()["error"]["message"]
    odd_token = httpx.post(f"{url}/chat/completions", headers={"Authorization": b"Bearer \xe9t\xe9"}, json={})
    assert odd_token.status_code == 401  # refused, not an error of the server
    assert engine.requests == []  # nothing was sampled for a refused request


def test_the_endpoint_listens_on_loopback_only_and_stops():
    tokenizer = chat_tokenizer(CHATML)
    engine = scripted_engine(tokenizer, TURNS)
    served = AgentEndpoint(tokenizer, SAMPLING)
    served.start()
    try:
        interfaces = psutil.net_if_addrs().values()
        others = {a.address for addresses in interfaces for a in addresses if a.family == socket.AF_INET} - {
            "127.0.0.1"
        }
        for address in others:  # the machine's other addresses (here: its network interface's)
            with pytest.raises(OSError):
                socket.create_connection((address, served.port), timeout=2).close()
        socket.create_connection(("127.0.0.1", served.port), timeout=2).close()
    finally:
        served.stop()
        served.stop()
        engine.shutdown()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", served.port), timeout=2).close()


def test_a_process_forked_after_the_endpoint_started_does_not_hold_its_port():
    tokenizer = chat_tokenizer(CHATML)
    served = AgentEndpoint(tokenizer, SAMPLING)
    served.start()
    try:
        (listener,) = [c for c in psutil.Process().net_connections("tcp") if c.laddr.port == served.port]
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # as an engine core forked after the endpoint: what does it hold at that number?
            os.close(read)
            os.write(write, os.readlink(f"/proc/self/fd/{listener.fd}").encode())
            os._exit(0)
        os.close(write)
        held = os.read(read, 256).decode()
        os.close(read)
        os.waitpid(child, 0)
        assert held == os.devnull
    finally:
        served.stop()
    with pytest.raises(OSError):  # the port is closed: no copy of the socket is left anywhere
        socket.create_connection(("127.0.0.1", served.port), timeout=2).close()


def test_an_agent_that_disconnects_mid_call_has_its_engine_request_cancelled_and_its_episode_dropped():
    cancelled = threading.Event()

    async def endless(engine, prompt_ids, on_tokens):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    tokenizer = chat_tokenizer(CHATML)
    engine = FakeEngine(endless)
    served = AgentEndpoint(tokenizer, SAMPLING)
    served.start()
    try:
        episode, url = open_episode(served, engine, tokenizer, group_id=0)
        client = openai.OpenAI(base_url=url, api_key=served.token, max_retries=0, timeout=1.0)
        with pytest.raises(openai.APITimeoutError):  # the agent gives up after 1 s and closes its connection
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "add a mug"}])
        # The engine's request went with the call (the episode was marked in the same step, before it).
        assert cancelled.wait(timeout=5)
        assert episode.conversation.dropped == "agent_disconnected"
    finally:
        served.stop()
        engine.shutdown()
