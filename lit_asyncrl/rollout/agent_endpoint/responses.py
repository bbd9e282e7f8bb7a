"""An answer in OpenAI's chat completion format, whole or as the chunks of a stream.

A stream is served whole once the answer is sampled (one chunk with the content and calls, one with the
finish reason): a client written for streaming works unchanged, and every answer is recorded the same way.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from lit_asyncrl.envs.tools import AssistantTurn
from lit_asyncrl.rollout.engine.protocol import TurnOutput


def chat_completion(answer: AssistantTurn, turn: TurnOutput, prompt_tokens: int, model: str) -> dict[str, Any]:
    """`answer` (the sampled `turn`, after a prompt of `prompt_tokens`) as a chat completion."""
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
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def completion_chunks(completion: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """`completion` as a stream's chunks: the message in one delta (calls indexed), then the finish reason,
    then the usage when the request asked for it (`stream_options.include_usage`)."""
    (choice,) = completion["choices"]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if "tool_calls" in message:
        delta["tool_calls"] = [{"index": index, **call} for index, call in enumerate(message["tool_calls"])]
    head = {key: completion[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"], "logprobs": None}]},
    ]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return chunks
