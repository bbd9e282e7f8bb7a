"""Start-up checks of a rollout service: refused before any engine starts, naming what to change."""

from __future__ import annotations

import random
from typing import Any

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.envs.base import Environment, call_blocking
from lit_asyncrl.envs.tools.user_turns import UserOpening
from lit_asyncrl.rollout.episodes.formats import EpisodeFormat
from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.rollout.serving.instances import training_instance


def check_tokenizer_fits_model(model_path: str, tokenizer: Any) -> None:
    """A tokenizer with ids past the model's embedding table is another model's tokenizer."""
    from transformers import AutoConfig

    vocab_size = getattr(AutoConfig.from_pretrained(model_path), "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"model.path={model_path}: its tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
            f"{vocab_size}; the folder mixes two models' files"
        )


def check_context_holds_a_turn(env: Environment, episode_format: EpisodeFormat, max_model_len: int, seed: int) -> None:
    """Refuse a context too short for the first prompt and one whole agent turn (`env.max_turn_tokens`):
    shorter, every episode would be cut inside its first answer and the run would train on stubs."""
    opening = Trajectory(group_id=-1)
    instance = training_instance(env, random.Random(seed))
    first = call_blocking(env.new_episode(instance).reset, seed)
    # A user who speaks first is asked only once the run's engines are up: measured up to their words.
    episode_format.open(opening, first.before_user if isinstance(first, UserOpening) else first)
    prompt = len(opening.token_ids)
    turn = env.max_turn_tokens
    if prompt + turn > max_model_len:
        key = config_key("rollout.max_model_len")
        raise ValueError(
            f"{key}={max_model_len} leaves no room for one agent turn: the first prompt of {type(env).__name__} "
            f"is already {prompt} tokens and a turn may take {turn} more (env.max_turn_tokens); "
            f"set {key} >= {prompt + turn}"
        )
