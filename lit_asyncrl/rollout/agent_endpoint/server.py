"""The agent endpoint: OpenAI's chat completions API over a run's engines, one URL per agent episode.

An agent program is given `base_url` = `http://127.0.0.1:<port>/episodes/<episode id>/v1` and the run's
bearer token; whatever it sends to `chat/completions` there is rendered (`conversation.py`), sampled by
the engine that plays the episode with the run's settings (`requests.py` refuses others) and recorded
under its episode with per-token versions and log-probs. The server is FastAPI under uvicorn on a thread
of its own, on a loopback socket the OS gives a free port, for agents in other processes; an agent in
this process calls the same application without a socket (`client_for`). Each call's rendering,
sampling and recording run on its engine's event loop, where the producer and the old-logit routes read
the same trajectories.

Why not vLLM's own OpenAI serving layer: it renders each request's whole conversation and tokenizes it
again, so the ids of earlier answers would be re-tokenized text, not what the engine sampled, and the
per-token weight versions never reach its responses. The episode formats here append each new message
to the ids already recorded and read calls with vLLM's tool parsers, the part of that layer that matters.
"""

# No `from __future__ import annotations`: FastAPI reads the route's `Request` annotation at runtime.
import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import hmac
import itertools
import json
import os
import secrets
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from lit_asyncrl.envs.agent_program import agent_outcome
from lit_asyncrl.envs.tools import AssistantTurn
from lit_asyncrl.rollout.agent_endpoint.connections import hidden_from_forked_children, in_process_connections
from lit_asyncrl.rollout.agent_endpoint.conversation import AgentConversation
from lit_asyncrl.rollout.agent_endpoint.requests import ChatRequest, RefusedRequest, checked_request
from lit_asyncrl.rollout.agent_endpoint.responses import chat_completion, completion_chunks
from lit_asyncrl.rollout.engine.protocol import Engine, TurnOutput
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.text import UnencodableTextError

#: The name the endpoint answers to (`model` in requests may be anything: there is one policy).
MODEL_NAME = "policy"
#: How often a call in flight checks that its agent is still connected, in seconds.
DISCONNECT_POLL_S = 0.2
#: Why an episode whose agent disconnected during a call is dropped.
AGENT_DISCONNECTED = "agent_disconnected"
#: How long the server keeps an idle connection open, in seconds (longer than clients keep theirs).
KEEP_ALIVE_S = 120
#: How long a claim waits for an episode at most, and how often it looks, in seconds.
MAX_CLAIM_WAIT_S = 60.0
CLAIM_POLL_S = 0.02


@dataclasses.dataclass
class AgentEpisode:
    """One open episode: where its calls are recorded, the engine that samples them and how.

    Attributes:
        conversation: the episode's calls as exact trajectories.
        engine: the engine that plays the episode (its calls run on that engine's loop).
        sampling: how its answers are sampled (the run's; top-1 for a held-out greedy episode).
        max_turn_tokens: most tokens of one answer (the task's `max_turn_tokens`).
        max_context: the engine's context in tokens.
    """

    conversation: AgentConversation
    engine: Engine
    sampling: SamplingSettings
    max_turn_tokens: int
    max_context: int
    episode_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    #: Calls in flight on the engine's loop (cancelled when the episode closes).
    calls: set[concurrent.futures.Future] = dataclasses.field(default_factory=set)
    #: An external agent's episode: its instance, whether an agent claimed it, and the outcome it posts
    #: (a future of the engine's loop).
    instance: Any = None
    claimed: bool = False
    outcome: asyncio.Future | None = None
    #: Set when the episode ends (on the engine's loop): a call that reaches it afterwards samples nothing.
    closed: bool = False
    _lock: asyncio.Lock | None = None

    async def call(self, request: ChatRequest) -> tuple[AssistantTurn, TurnOutput, int]:
        """Render, sample and record one call (on the engine's loop): the answer, the turn, the prompt's length."""
        if self.closed:  # its agent returned (or the run stopped) while this call's request was being read
            raise EpisodeClosed
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one call of an episode at a time: its trajectory grows in order
            conversation = self.conversation
            stop_ids = conversation.episode_format.stop_token_ids
            request_stop_ids = [token for token in request.stop_token_ids if token not in stop_ids]
            prompt = conversation.prompt_ids(request.messages, request.tools)
            room = self.max_context - len(prompt)
            if room < 1:
                raise RefusedRequest(f"the conversation ({len(prompt)} tokens) fills the context ({self.max_context})")
            max_tokens = min(request.max_tokens or self.max_turn_tokens, self.max_turn_tokens, room)
            turn = await conversation.sample(self.engine, self.sampling, max_tokens, [*stop_ids, *request_stop_ids])
            return conversation.answer(turn, request_stop_ids), turn, len(prompt)


class EpisodeClosed(Exception):
    """A call reached an episode that had ended (HTTP 410)."""


class AgentEndpoint:
    """A run's chat endpoint (see the module's docstring).

    Args:
        tokenizer: the policy's tokenizer (a request's `stop` strings must each be one of its tokens).
        sampling: the run's sampling settings (requests may not change them).
        connection_file: where to write the URL and token for agents in other processes (`ExternalAgentEnv`),
            removed at `stop`; None writes nothing.
    """

    def __init__(self, tokenizer: Any, sampling: SamplingSettings, connection_file: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.connection_file = None if connection_file is None else Path(connection_file)
        #: The bearer token every request must carry (made for the run, never logged).
        self.token = secrets.token_urlsafe(24)
        self.port: int | None = None
        self._episodes: dict[str, AgentEpisode] = {}
        #: External agents' episodes not claimed yet, oldest first.
        self._offered: collections.deque[AgentEpisode] = collections.deque()
        #: The in-process client of each event loop that runs agent programs (an engine's).
        self._connections: dict[asyncio.AbstractEventLoop, Any] = {}
        self._server: Any = None
        self._asgi_app: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve on a free loopback port, on a thread of its own (returns once the socket listens)."""
        import uvicorn

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))  # loopback only; the OS picks the port
        listener.listen(socket.SOMAXCONN)  # many agents may connect at once
        hidden_from_forked_children(listener)
        self.port = listener.getsockname()[1]
        self._asgi_app = self._app()
        config = uvicorn.Config(
            self._asgi_app,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=5,
            # Idle connections are closed by the clients (httpx after 5 s), never first by the server: a
            # server closing one as a client reuses it fails that call (seen in 2 of 16 runs of the 64-episode test).
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self._server = uvicorn.Server(config)
        server = self._server
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[listener])), name="agent-endpoint", daemon=True
        )
        self._thread.start()
        if self.connection_file is not None:
            self._write_connection_file()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_connection_file(self) -> None:
        """The URL and token for agents in other processes, readable by this user only (it holds the token)."""
        path = self.connection_file
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)  # a file that was there keeps its mode otherwise
        with os.fdopen(descriptor, "w") as file:
            json.dump({"url": self.url, "token": self.token}, file)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving (calls in flight are cancelled with their engine requests); safe to call twice."""
        for episode in list(self._episodes.values()):
            _cancel_calls(episode)
        self._close_connections(timeout_s)
        if self._server is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=timeout_s)
        self._server = None
        self._thread = None
        if self.connection_file is not None:
            self.connection_file.unlink(missing_ok=True)

    def _close_connections(self, timeout_s: float) -> None:
        """Close each loop's in-process client on its loop (a loop that no longer runs took it with it)."""
        pools = self._connections
        self._connections = {}
        for loop, pool in pools.items():
            if loop.is_running() and not loop.is_closed():
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(pool.close_pool(), loop).result(timeout_s)

    def open_episode(self, episode: AgentEpisode) -> str:
        """Serve `episode`'s calls; the base URL to give its agent's client."""
        self._episodes[episode.episode_id] = episode
        return f"{self.url}/episodes/{episode.episode_id}/v1"

    def client_for(self, base_url: str) -> Any:
        """An `openai.AsyncOpenAI` bound to `base_url` for an agent in this process (call on the loop it runs
        on). Its requests reach the endpoint's application directly, through httpx's ASGI transport: the
        same checks, recording and answers as over the socket, without a connection per call, whose
        pool costs more CPU than the call itself once a hundred episodes run at once. No retries: a call
        the endpoint refused or cut is the agent's to handle, never sampled twice."""
        import openai

        loop = asyncio.get_running_loop()
        if loop not in self._connections:
            self._connections[loop] = in_process_connections(self._asgi_app)
        return openai.AsyncOpenAI(
            base_url=base_url, api_key=self.token, max_retries=0, http_client=self._connections[loop]
        )

    async def offer(self, episode: AgentEpisode) -> Any:
        """An open episode for an external agent to claim (call on its engine's loop); what the agent
        posts as its outcome, once it does."""
        episode.outcome = asyncio.get_running_loop().create_future()
        self._offered.append(episode)
        return await episode.outcome

    def close_episode(self, episode: AgentEpisode) -> None:
        """The episode's URL answers no more. A call still in flight is cancelled with its engine request,
        and the episode dropped: its agent left during a call (it raised, timed out or returned without
        waiting), so the trajectory ends in an answer the agent never read."""
        episode.closed = True
        self._episodes.pop(episode.episode_id, None)
        with contextlib.suppress(ValueError):  # claimed, or never offered
            self._offered.remove(episode)
        if episode.calls:
            episode.conversation.dropped = episode.conversation.dropped or AGENT_DISCONNECTED
        _cancel_calls(episode)

    def _app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, Response, StreamingResponse
        from starlette.requests import ClientDisconnect

        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.post("/episodes/claim")
        async def claim(request: Request, wait_s: float = 10.0) -> JSONResponse:
            if not self._authorized(request):
                return _error(401, "authentication_error", "a valid bearer token for this run is required")
            deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_CLAIM_WAIT_S)
            episode = None
            while episode is None:
                if time.monotonic() >= deadline:
                    return Response(status_code=204)
                await asyncio.sleep(CLAIM_POLL_S)
                if self._offered and not await request.is_disconnected():  # a gone agent takes nothing
                    with contextlib.suppress(IndexError):  # the last one closed meanwhile
                        episode = self._offered.popleft()
            episode.claimed = True
            base_url = f"{self.url}/episodes/{episode.episode_id}/v1"
            return JSONResponse({"episode_id": episode.episode_id, "base_url": base_url, "instance": episode.instance})

        @app.post("/episodes/{episode_id}/outcome")
        async def outcome(episode_id: str, request: Request) -> JSONResponse:
            if not self._authorized(request):
                return _error(401, "authentication_error", "a valid bearer token for this run is required")
            episode = self._episodes.get(episode_id)
            if episode is None or episode.outcome is None:
                return _error(404, "not_found_error", f"no open external episode {episode_id}")
            try:
                body = await request.json()
                agent_outcome(body)
            except ValueError as error:
                return _error(400, "invalid_request_error", str(error))
            except ClientDisconnect:
                return _error(499, "client_closed_request", "the agent disconnected before its outcome was read")
            episode.engine.loop.call_soon_threadsafe(_settle, episode.outcome, body)
            return JSONResponse({"episode_id": episode_id, "recorded": True})

        @app.post("/episodes/{episode_id}/v1/chat/completions")
        async def chat_completions(episode_id: str, request: Request) -> JSONResponse:
            if not self._authorized(request):
                return _error(401, "authentication_error", "a valid bearer token for this run is required")
            episode = self._episodes.get(episode_id)
            if episode is None:
                return _error(404, "not_found_error", f"no open episode {episode_id}")
            try:
                body = await request.json()
                checked = checked_request(body, self.sampling.temperature, self.sampling.top_k, self.tokenizer)
            except (RefusedRequest, ValueError, TypeError, AttributeError, KeyError) as error:
                return _error(400, "invalid_request_error", f"malformed request: {error}")
            except ClientDisconnect:  # gone before its request was read (its episode was cancelled)
                return _error(499, "client_closed_request", "the agent disconnected before its request was read")
            call = asyncio.run_coroutine_threadsafe(episode.call(checked), episode.engine.loop)
            episode.calls.add(call)
            call.add_done_callback(episode.calls.discard)
            waiting = asyncio.wrap_future(call)
            try:
                while not (await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S))[0]:
                    if await request.is_disconnected():
                        # The agent is gone (it raised, timed out, closed its client): the engine's request
                        # is aborted with the call, and the episode is dropped with the reason.
                        episode.conversation.dropped = AGENT_DISCONNECTED
                        call.cancel()
                        return _error(499, "client_closed_request", "the agent disconnected during the call")
                if waiting.cancelled():  # the episode closed (its agent returned or the run stopped)
                    return _error(410, "episode_closed", "the episode closed during the call")
                answer, turn, prompt_tokens = waiting.result()
            except RefusedRequest as error:
                return _error(400, "invalid_request_error", str(error))
            except EpisodeClosed:
                return _error(410, "episode_closed", "the episode ended before this call")
            except (ValueError, TypeError, KeyError, UnencodableTextError) as error:
                # Messages the chat template or the tokenizer cannot take (e.g. content as a list of parts).
                return _error(400, "invalid_request_error", f"the messages cannot be rendered: {error!r}")
            except asyncio.CancelledError:
                # An in-process agent's call cancelled (its task was, or it gave up waiting): the same as a
                # disconnection, the engine's request goes with it.
                episode.conversation.dropped = AGENT_DISCONNECTED
                call.cancel()
                raise
            completion = chat_completion(answer, turn, prompt_tokens, MODEL_NAME)
            if checked.stream:
                events = (f"data: {json.dumps(chunk)}\n\n" for chunk in completion_chunks(completion, checked.usage))
                return StreamingResponse(itertools.chain(events, ["data: [DONE]\n\n"]), media_type="text/event-stream")
            return JSONResponse(completion)

        return app

    def _authorized(self, request: Any) -> bool:
        # As bytes: a header of other characters is refused, not an error.
        given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
        return hmac.compare_digest(given, f"Bearer {self.token}".encode())


def _settle(outcome: asyncio.Future, body: Any) -> None:
    if not outcome.done():  # a second post, or one after the episode timed out, changes nothing
        outcome.set_result(body)


def _cancel_calls(episode: AgentEpisode) -> None:
    for call in list(episode.calls):
        call.cancel()


def _error(status: int, kind: str, message: str) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)
