"""EWMAReference in other processes: under 2-process CPU DDP, and with vLLM, Hydra and lit_asyncrl unavailable.

The second test imports the whole ``asyncrl_callbacks`` package, so it guards every callback exported there.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import asyncrl_callbacks
import torch

HERE = Path(__file__).parent


def child_env() -> dict[str, str]:
    """The children find asyncrl_callbacks (installed or not) and the test helpers; one thread each."""
    paths = [str(Path(asyncrl_callbacks.__file__).parents[1]), str(HERE), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "OMP_NUM_THREADS": "1"}


def test_ddp_ranks_hold_identical_averages(tmp_path):
    result = subprocess.run(
        [sys.executable, str(HERE / "ewma_ddp_run.py"), str(tmp_path)],
        cwd=tmp_path,
        env=child_env(),
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


BLOCKED_IMPORTS = textwrap.dedent(
    """
    import sys

    BLOCKED = ("vllm", "hydra", "omegaconf", "lit_asyncrl")
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]
    for name in BLOCKED:
        sys.modules[name] = None  # `import name` raises ImportError; `find_spec(name)` reports it missing

    import asyncrl_callbacks
    from asyncrl_callbacks import EWMAReference
    from ewma_models import SGDModel, loader, tiny_trainer

    ewma = EWMAReference(staleness_window="auto", module_attr="policy", tau=0.5, patience=2)
    model = SGDModel(values=[0.1] * 4, gaps=[1, 2, 1, 3], ewmas=[ewma])
    tiny_trainer(".", 4, [ewma]).fit(model, loader())
    assert ewma.num_resets == 2 and ewma.staleness_window == 3, (ewma.num_resets, ewma.staleness_window)
    assert all(getattr(asyncrl_callbacks, name) for name in asyncrl_callbacks.__all__)  # every exported callback
    leaked = sorted(name for name, module in sys.modules.items() if name.split(".")[0] in BLOCKED and module)
    assert not leaked, leaked
    for name in BLOCKED:
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise AssertionError(f"{name} was importable")
    print("EWMA OK")
    """
)


def test_callbacks_work_without_vllm_hydra_or_lit_asyncrl(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "EWMA OK" in result.stdout
