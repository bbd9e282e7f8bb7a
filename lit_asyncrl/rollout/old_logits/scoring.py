"""Exact pi_old for tokens still in the system: collect the unscored ones, score them, attach.

Used by the interruption-sync route (score with the trainer's still-resident weights while the
engine is paused) and by the dedicated old-logit worker. Collection and attachment run on the
engine loop (where trajectories are mutated); scoring runs wherever the scoring weights live.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.scoring import logits_to_token_logprobs

if TYPE_CHECKING:
    from lit_asyncrl.rollout.engine.protocol import Engine


@dataclasses.dataclass
class ScoreRequest:
    """Score `positions` of `trajectory` given its tokens up to the last of them."""

    trajectory: Trajectory
    token_ids: list[int]
    positions: list[int]


def collect_unscored(trajectories: Iterable[Trajectory]) -> list[ScoreRequest]:
    """A request per trajectory that has policy tokens without pi_old (a copy of its tokens)."""
    requests = []
    for trajectory in trajectories:
        positions = trajectory.unscored_positions()
        if positions:
            requests.append(ScoreRequest(trajectory, list(trajectory.token_ids[: positions[-1] + 1]), positions))
    return requests


@torch.no_grad()
def score_requests(
    score_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    requests: list[ScoreRequest],
    *,
    temperature: float,
    top_k: int,
    pad_id: int,
    batch_size: int = 64,
) -> list[list[float]]:
    """Log-probs of each request's positions under `score_fn` (right-padded batches, no gradient).

    `score_fn(input_ids, attention_mask) -> logits` takes CPU tensors [b, T] (moving them to its
    own device) and returns [b, T, V] logits of the weights to score with.
    """
    scores: list[list[float]] = []
    for start in range(0, len(requests), batch_size):
        chunk = requests[start : start + batch_size]
        length = max(len(request.token_ids) for request in chunk)
        input_ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), length), dtype=torch.long)
        for row, request in enumerate(chunk):
            input_ids[row, : len(request.token_ids)] = torch.tensor(request.token_ids)
            attention_mask[row, : len(request.token_ids)] = 1
        logits = score_fn(input_ids, attention_mask)
        logprobs = logits_to_token_logprobs(logits, input_ids.to(logits.device), temperature, top_k).cpu()  # [b, T]
        scores.extend(logprobs[row, request.positions].tolist() for row, request in enumerate(chunk))
    return scores


def model_score_fn(model: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A `score_fn` running a Hugging Face causal LM on its own device."""
    device = next(model.parameters()).device

    def score_fn(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits

    return score_fn


def attach(requests: list[ScoreRequest], scores: list[list[float]], version: int) -> int:
    """Write pi_old scored under `version` into the trajectories; returns the tokens attached.

    A token known to come from another version is left unscored (its pi_old stays NaN, and the
    loss masks and counts it); tokens of a turn still streaming are checked again when the turn's
    final version spans arrive (`Trajectory.set_versions`).
    """
    attached = 0
    for request, values in zip(requests, scores):
        trajectory = request.trajectory
        for position, value in zip(request.positions, values):
            if trajectory.versions[position] == version:
                trajectory.old_logprobs[position] = value
                trajectory.old_versions[position] = version
                attached += 1
    return attached


def score_unscored_on(
    engine: Engine,
    trajectories: Callable[[], list[Trajectory]],
    score_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    version: int,
    temperature: float,
    top_k: int,
    pad_id: int,
) -> int:
    """Attach pi_old from `score_fn` to every token of `version` still unscored in `trajectories()`;
    returns how many. The trajectories are read and written on `engine`'s loop, which owns them; the
    forward runs on the caller's thread, with the caller's weights."""

    async def collect() -> list[ScoreRequest]:
        return collect_unscored(trajectories())

    requests = engine.run(collect())
    scores = score_requests(score_fn, requests, temperature=temperature, top_k=top_k, pad_id=pad_id)

    async def write_back() -> int:
        return attach(requests, scores, version)

    return engine.run(write_back())
