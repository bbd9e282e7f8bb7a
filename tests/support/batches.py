"""Hand-made training batches in the schema of `lit_asyncrl.rollout.service`: four right-padded episodes,
versions given per policy token; and the sampling settings their mu is scored with."""

from __future__ import annotations

import math

import torch

from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.scoring import token_logprobs

TEMPERATURE, TOP_K = 1.0, -1


# Four right-padded episodes of length <= 6. Policy tokens (loss_mask) per row:
#   row 0: positions 2, 3, 4      advantage +1
#   row 1: positions 2, 3         advantage +1
#   row 2: position 3             advantage -1
#   row 3: positions 1, 2         advantage -1   (row 3 is padded after position 3)
INPUT_IDS = [
    [1, 12, 5, 14, 3, 2],
    [1, 12, 7, 3, 13, 2],
    [1, 12, 13, 9, 3, 2],
    [1, 8, 3, 13, 0, 0],
]
ATTENTION = [[1] * 6, [1] * 6, [1] * 6, [1, 1, 1, 1, 0, 0]]
POLICY_POSITIONS = {0: [2, 3, 4], 1: [2, 3], 2: [3], 3: [1, 2]}
ROW_ADVANTAGE = {0: 1.0, 1: 1.0, 2: -1.0, 3: -1.0}


def make_batch(
    versions_by_row: dict[int, list[int]], success: list[float], behavior: torch.Tensor | None = None
) -> dict:
    """A batch in the schema of `lit_asyncrl.rollout.service`; versions given per policy token."""
    loss_mask = torch.zeros(4, 6, dtype=torch.bool)
    versions = torch.full((4, 6), -1, dtype=torch.long)
    advantages = torch.zeros(4, 6)
    for row, positions in POLICY_POSITIONS.items():
        for position, version in zip(positions, versions_by_row[row], strict=True):
            loss_mask[row, position] = True
            versions[row, position] = version
            advantages[row, position] = ROW_ADVANTAGE[row]
    behavior = torch.full((4, 6), -1.0) if behavior is None else behavior
    return {
        "input_ids": torch.tensor(INPUT_IDS, dtype=torch.long),
        "attention_mask": torch.tensor(ATTENTION, dtype=torch.long),
        "loss_mask": loss_mask,
        "behavior_logprobs": torch.where(loss_mask, behavior, 0.0),
        "versions": versions,
        "old_logprobs": torch.full((4, 6), math.nan),
        "advantages": advantages,
        "rewards": torch.tensor([1.0, 0.0, 0.0, -0.2]),
        "success": torch.tensor(success),
        "group_ids": torch.tensor([0, 0, 1, 1]),
        "temperature": TEMPERATURE,
        "top_k": TOP_K,
    }


def own_logprobs(module: AsyncRLModule) -> torch.Tensor:
    """[4, 6] the module's policy's own log-probs of the batch's tokens (an on-policy mu)."""
    batch = make_batch(all_version(0), success=[0.0] * 4)
    with torch.no_grad():
        return token_logprobs(module.policy, batch["input_ids"], batch["attention_mask"], TEMPERATURE, TOP_K)


def all_version(version: int) -> dict[int, list[int]]:
    return {row: [version] * len(positions) for row, positions in POLICY_POSITIONS.items()}
