"""The agent endpoint: OpenAI's chat completions API over a run's engine, one URL per agent episode.

An agent program is given `base_url` = `http://127.0.0.1:<port>/episodes/<episode id>/v1` and the run's
bearer token; whatever it sends to `chat/completions` there is rendered (`conversation.py`), sampled by
the run's engine with the run's settings (`requests.py` refuses others) and recorded under its episode
with per-token versions and log-probs. The server is FastAPI under uvicorn, run on the engine's own event
loop (where every episode's requests are awaited), on a loopback socket the OS gives a free port.

Why not vLLM's own OpenAI serving layer: it renders each request's whole conversation and tokenizes it
again, so the ids of earlier answers would be re-tokenized text, not what the engine sampled, and the
per-token weight versions never reach its responses. The episode formats here append each new message
to the ids already recorded and read calls with vLLM's tool parsers, the part of that layer that matters.
"""

# No `from __future__ import annotations`: FastAPI reads the route's `Request` annotation at runtime.
import asyncio
import concurrent.futures
import hmac
import json
import secrets
import socket
import time
import uuid
from typing import Any

from lit_asyncrl.envs.tools import AssistantTurn
from lit_asyncrl.rollout.agent_endpoint.conversation import AgentConversation
from lit_asyncrl.rollout.agent_endpoint.requests import RefusedRequest, checked_request
from lit_asyncrl.rollout.engine.protocol import Engine, TurnOutput
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.episodes.tool_calls import ChatToolFormat

#: The name the endpoint answers to (`model` in requests may be anything: there is one policy).
MODEL_NAME = "policy"
#: How often a call in flight checks that its agent is still connected, in seconds.
DISCONNECT_POLL_S = 0.2
#: Why an episode whose agent disconnected during a call is dropped.
AGENT_DISCONNECTED = "agent_disconnected"


class AgentEndpoint:
    """A run's chat endpoint (see the module's docstring).

    Args:
        engine: the run's engine (the server runs on its loop; every call is one `generate`).
        episode_format: the policy's chat rendering with its tool parser.
        sampling: the run's sampling settings (requests may not change them).
        max_context: the engine's context in tokens (`rollout.max_model_len`).
        max_turn_tokens: tokens of an answer when a request names no `max_tokens`, and at most.
    """

    def __init__(
        self,
        engine: Engine,
        episode_format: ChatToolFormat,
        sampling: SamplingSettings,
        max_context: int,
        max_turn_tokens: int,
    ) -> None:
        self.engine = engine
        self.episode_format = episode_format
        self.sampling = sampling
        self.max_context = max_context
        self.max_turn_tokens = max_turn_tokens
        #: The bearer token every request must carry (made for the run, never logged).
        self.token = secrets.token_urlsafe(24)
        self.port: int | None = None
        self._episodes: dict[str, tuple[AgentConversation, asyncio.Lock]] = {}
        self._server: Any = None
        self._serving: concurrent.futures.Future | None = None

    def start(self) -> None:
        """Serve on a free loopback port, on the engine's loop (returns once the socket listens)."""
        import uvicorn

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))  # loopback only; the OS picks the port
        listener.listen()
        self.port = listener.getsockname()[1]
        config = uvicorn.Config(
            self._app(), lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=5
        )
        self._server = uvicorn.Server(config)
        self._serving = asyncio.run_coroutine_threadsafe(self._server.serve(sockets=[listener]), self.engine.loop)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving (requests in flight are cancelled with their engine requests); safe to call twice."""
        if self._server is None:
            return
        self._server.should_exit = True
        try:
            self._serving.result(timeout=timeout_s)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            self._serving.cancel()
        self._server = None

    def open_episode(self, group_id: int) -> str:
        """A new episode's base URL for the agent's client (its calls are recorded under it)."""
        episode_id = uuid.uuid4().hex
        self._episodes[episode_id] = (AgentConversation(self.episode_format, group_id), asyncio.Lock())
        return f"http://127.0.0.1:{self.port}/episodes/{episode_id}/v1"

    def close_episode(self, base_url: str) -> AgentConversation:
        """The episode's recorded calls; its URL answers no more."""
        episode_id = base_url.rstrip("/").split("/")[-2]
        conversation, _ = self._episodes.pop(episode_id)
        return conversation

    def _app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse

        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.post("/episodes/{episode_id}/v1/chat/completions")
        async def chat_completions(episode_id: str, request: Request) -> JSONResponse:
            if not hmac.compare_digest(request.headers.get("authorization", ""), f"Bearer {self.token}"):
                return _error(401, "authentication_error", "a valid bearer token for this run is required")
            episode = self._episodes.get(episode_id)
            if episode is None:
                return _error(404, "not_found_error", f"no open episode {episode_id}")
            try:
                body = await request.json()
                checked = checked_request(body, self.sampling.temperature, self.sampling.top_k)
            except (RefusedRequest, ValueError) as error:
                return _error(400, "invalid_request_error", str(error))
            conversation, lock = episode
            async with lock:  # one call of an episode at a time: its trajectory grows in order
                prompt = conversation.prompt_ids(checked.messages, checked.tools)
                room = self.max_context - len(prompt)
                if room < 1:
                    return _error(
                        400, "invalid_request_error", f"the conversation ({len(prompt)} tokens) fills the context"
                    )
                generation = asyncio.ensure_future(
                    self.engine.generate(
                        prompt,
                        max_tokens=min(checked.max_tokens or self.max_turn_tokens, self.max_turn_tokens, room),
                        temperature=self.sampling.temperature,
                        top_k=self.sampling.top_k,
                        stop_token_ids=self.episode_format.stop_token_ids,
                    )
                )
                while not (await asyncio.wait({generation}, timeout=DISCONNECT_POLL_S))[0]:
                    if await request.is_disconnected():
                        # The agent is gone (it raised, timed out, closed its client): the engine's request
                        # is aborted with the task, and the episode is dropped with the reason.
                        generation.cancel()
                        conversation.dropped = AGENT_DISCONNECTED
                        return _error(499, "client_closed_request", "the agent disconnected during the call")
                turn = generation.result()
                answer = conversation.record(turn)
            return JSONResponse(_completion(answer, turn, len(prompt)))

        return app


def _completion(answer: AssistantTurn, turn: TurnOutput, prompt_tokens: int) -> dict[str, Any]:
    """An answer in OpenAI's chat completion format."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content or None}
    if answer.calls:
        message["tool_calls"] = [
            {
                "id": call.call_id or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments),
                },
            }
            for call in answer.calls
        ]
    finish = "tool_calls" if answer.calls else ("length" if turn.finish_reason == "length" else "stop")
    completion_tokens = len(turn.token_ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_NAME,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _error(status: int, kind: str, message: str) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)
