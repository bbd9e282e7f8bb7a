"""Row chunks for the passes over a batch that only reduce it (metrics, M2PO's selection).

On CPU, a few hundred thousand tokens at a time keep the temporaries in cache and on the heap: a
fresh ``[B, T]`` temporary of 4M tokens is a 16-32 MB allocation whose page faults cost more than the
arithmetic on it. On an accelerator the whole batch is one chunk (one kernel per operation).
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor

CPU_CHUNK_TOKENS = 1 << 17


def row_chunks(batch: Tensor) -> Iterator[slice]:
    """Slices of ``batch``'s rows (``[B, T]``), in order, covering every row once."""
    rows, length = batch.shape
    step = max(rows, 1) if batch.device.type != "cpu" else max(1, CPU_CHUNK_TOKENS // max(length, 1))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))
