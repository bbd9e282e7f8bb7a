"""A checkpoint exported with `lit-asyncrl export`, read back as the tensors of its folder."""

from __future__ import annotations

from pathlib import Path

import torch

from lit_asyncrl.export.main import main as export_main


def exported_tensors(checkpoint: Path, out: Path, *flags: str) -> dict[str, torch.Tensor]:
    """Export `checkpoint` to `out` (with `flags`, e.g. `--weights ewma`) and load its safetensors."""
    from safetensors.torch import load_file

    assert export_main([str(checkpoint), "--out", str(out), *flags]) == 0
    return load_file(str(out / "model.safetensors"))


def assert_exported_equal(exported: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Every tensor of `expected` (by the policy's parameter names) is in `exported`, bit for bit."""
    missing = sorted(set(expected) - set(exported))
    assert not missing, missing
    for name, tensor in expected.items():
        assert torch.equal(exported[name], tensor), name
