"""EWMAReference in other processes: under 2-process CPU DDP, with vLLM, Hydra, OmegaConf and lit_asyncrl unavailable.

One run checks both (a process's Lightning import is most of its cost; the ranks are forked from the
run's process, so it is paid once); the ranks import the whole ``asyncrl_callbacks`` package, so it
guards every callback exported there.
"""

import os
import subprocess
import sys
from pathlib import Path

import asyncrl_callbacks
import torch

HERE = Path(__file__).parent


def child_env(temp_dir: Path) -> dict[str, str]:
    """The children find asyncrl_callbacks (installed or not) and the test helpers; one thread each.
    Their temp dir is the test's: Lightning's fork launcher leaves an empty dir there."""
    paths = [str(Path(asyncrl_callbacks.__file__).parents[1]), str(HERE), os.environ.get("PYTHONPATH", "")]
    return os.environ | {
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(temp_dir),
    }


def test_ddp_ranks_hold_identical_averages_without_vllm_hydra_or_lit_asyncrl(tmp_path):
    result = subprocess.run(
        [sys.executable, str(HERE / "ewma_ddp_run.py"), str(tmp_path)],
        cwd=tmp_path,
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for name, tensor in rank0["live"].items():
        assert torch.equal(tensor, rank1["live"][name])  # the all-reduced step keeps the weights identical
    for name, tensor in rank0["average"].items():
        assert torch.equal(tensor, rank1["average"][name])
        assert not torch.equal(tensor, rank0["live"][name])  # the average is not trivially the live weights
    # Only the gathered values give these: rank 0 alone would see W = 2, rank 1 alone would never reset.
    assert rank0["window"] == rank1["window"] == 5
    assert rank0["resets"] == rank1["resets"] == 3
    assert rank0["total_weight"] == rank1["total_weight"]
    for rank in (rank0, rank1):
        assert rank["exported"] == sorted(asyncrl_callbacks.__all__)  # every exported callback imported
        assert rank["leaked"] == [] and rank["importable"] == []
