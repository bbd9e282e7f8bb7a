"""What an agent's chat request may ask, checked before anything is sampled.

The trainer scores what the engine sampled under the run's sampling settings, so a request may leave
them out or repeat them, never change them: another temperature, top-k or top-p, several choices,
penalties, logit biases or a forced output format are refused with a message naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Fields that would change what the engine samples (or how many answers), refused unless at their neutral value.
_NEUTRAL = {
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
    "response_format": None,
    "seed": None,
    "logprobs": False,
    "top_logprobs": None,
}


class RefusedRequest(ValueError):
    """A request the endpoint will not serve (HTTP 400), with the field and the reason."""


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked chat request: its messages, the tools offered (None: none), the most tokens to sample and
    the tokens its `stop` strings are."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    max_tokens: int | None
    stop_token_ids: tuple[int, ...] = ()
    #: Answer as a stream (served whole once sampled), with the usage chunk when asked.
    stream: bool = False
    usage: bool = False


def checked_request(body: dict[str, Any], temperature: float, top_k: int, tokenizer: Any) -> ChatRequest:
    """`body` (an OpenAI chat completion request) as a `ChatRequest`, or `RefusedRequest` naming the field."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise RefusedRequest("messages must be a non-empty list of chat messages")
    for field, neutral in _NEUTRAL.items():
        if body.get(field, neutral) not in (neutral, None):
            raise RefusedRequest(
                f"{field}={body[field]!r} is not served: the trainer scores one sampled answer per call"
            )
    if "temperature" in body and body["temperature"] is not None and float(body["temperature"]) != temperature:
        raise RefusedRequest(
            f"temperature={body['temperature']} differs from the run's {temperature} (rollout.temperature): "
            "the trainer scores what the run's settings sampled"
        )
    if body.get("top_p") not in (None, 1, 1.0):
        raise RefusedRequest(f"top_p={body['top_p']} is not the run's (1.0): the trainer scores the run's sampling")
    asked_top_k = body.get("top_k")
    top_k_off = top_k <= 0  # -1 here, 0 or -1 in vLLM's and clients' terms
    if asked_top_k is not None and not (asked_top_k == top_k or (top_k_off and asked_top_k in (0, -1))):
        raise RefusedRequest(f"top_k={asked_top_k} differs from the run's {top_k} (rollout.top_k)")
    tool_choice = body.get("tool_choice", "auto")
    if tool_choice not in ("auto", "none"):
        raise RefusedRequest(f"tool_choice={tool_choice!r} is not served (auto or none)")
    tools = body.get("tools") or None
    if tools is not None and any(tool.get("function", {}).get("strict") for tool in tools):
        raise RefusedRequest(
            "tools with strict=true would constrain sampling; the trainer scores unconstrained sampling"
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RefusedRequest(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    stop_token_ids = _stop_token_ids(body.get("stop"), tokenizer)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RefusedRequest(f"stream must be true or false, got {stream!r}")
    usage = bool((body.get("stream_options") or {}).get("include_usage", False))
    # `none` renders the call without the tools (forbidding calls would constrain sampling): the model is not
    # shown them, and a call it writes anyway is returned as one.
    offered = None if tool_choice == "none" else tools
    return ChatRequest(messages, offered, max_tokens, stop_token_ids, stream, usage)


def _stop_token_ids(stop: Any, tokenizer: Any) -> tuple[int, ...]:
    """A request's `stop` strings as the policy's tokens. Each must be one token: the engine stops at
    token ids, so the answer ends exactly there and its ids are what was sampled (a string spread over
    several tokens would need the sampled ids cut inside a token or re-tokenized text)."""
    if stop is None:
        return ()
    strings = [stop] if isinstance(stop, str) else stop
    if not isinstance(strings, list) or not all(isinstance(text, str) and text for text in strings):
        raise RefusedRequest(f"stop must be a string or a list of strings, got {stop!r}")
    ids = []
    for text in strings:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            raise RefusedRequest(
                f"stop={text!r} is {len(encoded)} tokens of the policy's tokenizer; only single-token stop strings "
                "are served (the answer must end exactly at a sampled token)"
            )
        ids.append(encoded[0])
    return tuple(ids)
