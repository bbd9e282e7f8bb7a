"""SnapshotReference.exact: False when the snapshots round the live weights (a lower-precision storage dtype)."""

import pytest
import torch
from torch import nn

from lit_asyncrl.reference import SnapshotReference


@pytest.mark.parametrize(
    ("storage_dtype", "exact"),
    [
        (None, True),
        ("float32", True),
        ("float64", True),
        ("bfloat16", False),
        ("float16", False),
        ("torch.bfloat16", False),
    ],
)
def test_exact_before_the_fit_assumes_float32_weights(storage_dtype, exact):
    assert SnapshotReference(storage_dtype=storage_dtype).exact is exact


def with_policy(dtype: torch.dtype) -> nn.Module:
    holder = nn.Module()
    holder.policy = nn.Linear(4, 3).to(dtype)
    return holder


@pytest.mark.parametrize(
    ("live", "storage_dtype", "exact"),
    [
        (torch.float32, None, True),
        (torch.bfloat16, None, True),
        (torch.float32, "bfloat16", False),  # 8 bits of mantissa for 24: rounded
        (torch.float32, "float16", False),
        (torch.float64, "float32", False),
        (torch.bfloat16, "bfloat16", True),  # bf16 training: the snapshot holds the weights as they are
        (torch.bfloat16, "float32", True),
        (torch.bfloat16, "float16", False),  # more mantissa, far less range: not lossless
        (torch.float16, "bfloat16", False),
        (torch.float16, "float32", True),
    ],
)
def test_exact_compares_the_storage_dtype_with_the_live_weights(live, storage_dtype, exact):
    reference = SnapshotReference(storage_dtype=storage_dtype)
    reference.retention.setup(None, with_policy(live), "fit")  # what the Trainer does before the fit
    assert reference.exact is exact
