"""A simulated user played by a frozen language model on a vLLM engine of its own.

tau2-bench's customers are a hosted model told the customer's goal; here the user model is any
local model folder (or `smollm2_135m`, which works offline) served by an engine of its own, which
the rollout service's `make_engine` starts with the run (`envs/resources.py`) and `close` stops. Its weights never
change: no version is ever pushed to it, and nothing it writes is trained on (the user's answers are
environment text in the agent's context).

Episodes await `reply` on the policy engine's event loop; the request runs on the user engine's
own loop, so every episode waiting for the user yields, the user engine batches the questions of
all of them, and a cancelled episode cancels its request there too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from lit_asyncrl.envs.resources import EngineMaker, FrozenModel
from lit_asyncrl.envs.users.simulated import Message, SimulatedUser, UserGoal

#: Dtypes the user engine may run in.
DTYPES = ("float32", "bfloat16", "float16")


class LLMUser(SimulatedUser):
    """The user's messages are sampled from `model`, prompted with the goal's instructions.

    With a chat template, the goal's instructions are the system message, the agent's messages are
    user messages and the user's own are assistant messages (the model plays the customer). A
    model without one (e.g. the built-in tiny model, for plumbing tests) is prompted with a plain
    transcript (`Agent: ...` / `Customer: ...`). Sampling stops at the end of the turn or the first
    newline.

    Args:
        model: the user model: a local Hugging Face folder, `smollm2_135m`, or `tiny`.
        max_reply_tokens: most tokens of one answer.
        temperature: the user's sampling temperature (0 = greedy).
        dtype: the user engine's dtype.
        max_model_len: the user engine's context in tokens (instructions plus the conversation).
        kv_cache_gib: the user engine's KV cache in GiB (fixed, so two engines fit beside each other).
        seed: the user engine's sampling seed.
        end_markers: texts with which the user model ends the conversation (tau2's users write
            `###STOP###`, `###TRANSFER###` or `###OUT-OF-SCOPE###`): a reply that contains one answers
            None; none (the default) = the user never ends it.
    """

    def __init__(
        self,
        model: str = "smollm2_135m",
        max_reply_tokens: int = 24,
        temperature: float = 0.7,
        dtype: str = "float32",
        max_model_len: int = 512,
        kv_cache_gib: float = 0.25,
        seed: int = 0,
        end_markers: Sequence[str] = (),
    ) -> None:
        if isinstance(max_reply_tokens, bool) or not isinstance(max_reply_tokens, int) or max_reply_tokens < 1:
            raise ValueError(f"env.user.max_reply_tokens must be an integer >= 1, got {max_reply_tokens!r}")
        if not temperature >= 0:
            raise ValueError(f"env.user.temperature must be >= 0, got {temperature}")
        if dtype not in DTYPES:
            raise ValueError(f"env.user.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len <= max_reply_tokens:
            raise ValueError(
                f"env.user.max_model_len must be an integer above max_reply_tokens={max_reply_tokens}, "
                f"got {max_model_len!r}"
            )
        if not kv_cache_gib > 0:
            raise ValueError(f"env.user.kv_cache_gib must be > 0, got {kv_cache_gib}")
        if isinstance(end_markers, str) or any(not isinstance(m, str) or not m.strip() for m in end_markers):
            raise ValueError(f"env.user.end_markers must be a list of non-blank strings, got {end_markers!r}")
        self.model = model
        self.max_reply_tokens = max_reply_tokens
        self.temperature = float(temperature)
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.seed = seed
        self.end_markers = tuple(end_markers)
        self._engine: Any = None
        self._tokenizer: Any = None
        self._stop_ids: list[int] = []

    def start(self, make_engine: EngineMaker | None = None) -> None:
        from transformers import AutoTokenizer

        from lit_asyncrl.models.resolve import resolve_model_path

        if self._engine is not None:
            return
        if make_engine is None:
            raise ValueError(
                "LLMUser.start needs make_engine (the rollout service passes one): "
                "the user's model runs on an engine of its own"
            )
        path = str(resolve_model_path(self.model))
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        newline = self._tokenizer.encode("\n", add_special_tokens=False)
        self._stop_ids = list(dict.fromkeys([self._tokenizer.eos_token_id, *(newline if len(newline) == 1 else [])]))
        frozen = FrozenModel(path, self.dtype, self.max_model_len, int(self.kv_cache_gib * 2**30), self.seed)
        self._engine = make_engine(frozen)

    def close(self) -> None:
        engine = self._engine
        self._engine = None
        if engine is not None:
            engine.shutdown()

    @property
    def engine(self) -> Any:
        """The user's engine (None before `start` and after `close`)."""
        return self._engine

    async def reply(self, goal: UserGoal, conversation: Sequence[Message]) -> str | None:
        engine = self._engine
        if engine is None:
            raise RuntimeError("LLMUser.reply before LLMUser.start (the rollout service starts the user with the run)")
        prompt_ids = user_prompt_ids(self._tokenizer, goal.instructions, conversation)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"the conversation ({len(prompt_ids)} tokens) fills env.user.max_model_len={self.max_model_len}"
            )
        request = engine.generate(
            prompt_ids,
            max_tokens=min(self.max_reply_tokens, room),
            temperature=self.temperature,
            stop_token_ids=self._stop_ids,
        )
        turn = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(request, engine.loop))
        text = self._tokenizer.decode(turn.token_ids, skip_special_tokens=True)
        return None if any(marker in text for marker in self.end_markers) else text


def user_prompt_ids(tokenizer: Any, instructions: str, conversation: Sequence[Message]) -> list[int]:
    """The user model's prompt: the goal's instructions, then the conversation from the user's side
    (with a chat template the agent speaks as "user" and the simulated user as "assistant")."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": instructions}]
        messages += [{"role": "assistant" if m.speaker == "user" else "user", "content": m.text} for m in conversation]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    lines = [instructions, *(f"{'Customer' if m.speaker == 'user' else 'Agent'}: {m.text}" for m in conversation)]
    return tokenizer.encode("\n".join([*lines, "Customer:"]), add_special_tokens=True)
