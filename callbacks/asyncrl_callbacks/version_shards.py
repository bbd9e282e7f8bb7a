"""Group the policy tokens of a batch by the weight version that sampled them ("version shards").

With partial rollouts one sequence can span several versions, so a shard is the set of *rows* that
contain at least one masked token of that version. Scoring a shard runs one forward over those rows
only; the caller keeps, from that forward, the positions whose token belongs to the shard's version.
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class VersionShard:
    """The rows of a batch holding at least one policy token sampled by ``version``.

    Attributes:
        version: The weight version.
        rows: Sorted row indices, long ``[R]``, on the device of the batch.
        token_mask: Bool ``[R, T]``: the positions of those rows that belong to ``version``
            (policy tokens only).
    """

    version: int
    rows: Tensor
    token_mask: Tensor


def version_shards(token_versions: Tensor, loss_mask: Tensor) -> list[VersionShard]:
    """Split a batch into one shard per distinct version among its policy tokens.

    Args:
        token_versions: Long ``[B, T]``: the version that sampled each token.
        loss_mask: Bool ``[B, T]``: policy tokens. Other positions (prompt, environment output,
            padding) never create a shard, whatever version they carry.

    Returns:
        Shards sorted by version; empty when no token is masked.

    Example::

        versions = torch.tensor([[0, 1], [1, 2], [2, 2]])
        shards = version_shards(versions, torch.ones(3, 2, dtype=torch.bool))
        [s.version for s in shards]  # [0, 1, 2]
        shards[1].rows  # tensor([0, 1])
    """
    if token_versions.shape != loss_mask.shape:
        raise ValueError(
            f"token_versions {tuple(token_versions.shape)} and loss_mask {tuple(loss_mask.shape)} must have the same [B, T] shape"
        )
    loss_mask = loss_mask.bool()
    shards = []
    for version in torch.unique(token_versions[loss_mask]).tolist():  # sorted ascending
        in_version = (token_versions == version) & loss_mask  # [B, T]
        rows = in_version.any(dim=1).nonzero().squeeze(1)  # [R]
        shards.append(VersionShard(version=int(version), rows=rows, token_mask=in_version[rows]))
    return shards
