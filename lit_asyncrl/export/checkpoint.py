"""A checkpoint of this library read back: the policy as the run had it at save time.

The checkpoint holds what trained (the frozen base under a LoRA adapter and the frozen layers of
`model.train_last_layers` come back from the model folder it records, `frozen_checkpoint.py`), and
with a PPO-EWMA reference the average of the trained tensors. `AsyncRLModule.load_from_checkpoint`
puts them together as a resume does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

#: The module's hyper-parameters every checkpoint of this library holds.
MODULE_KEYS = ("model_path", "lora", "train_last_layers")
#: Where the EWMA reference's callback keeps its average (`asyncrl_callbacks.ewma`).
EWMA_KEY = "ewma_reference"


class NotOurCheckpointError(ValueError):
    """The file is not a checkpoint this library wrote."""


@dataclasses.dataclass
class RunCheckpoint:
    """The parts of a checkpoint an export reads.

    Attributes:
        path: the checkpoint file.
        raw: the checkpoint as `torch.load` gives it.
        hyper_parameters: the module's (`model_path`, `lora`, ...).
    """

    path: Path
    raw: dict[str, Any]
    hyper_parameters: dict[str, Any]

    @property
    def lora_rank(self) -> int:
        return int(self.hyper_parameters["lora"]["rank"])

    @property
    def global_step(self) -> int:
        return int(self.raw.get("global_step", 0))

    def ewma_average(self) -> dict[str, torch.Tensor]:
        """The PPO-EWMA reference's average of the trained tensors, by the policy's parameter names.

        Raises:
            ValueError: when the run kept no average (its reference was not PPO-EWMA) or several.
        """
        averages = self.raw.get(EWMA_KEY, {})
        if len(averages) != 1:
            raise ValueError(
                f"--weights ewma: {self.path} holds {len(averages)} EWMA averages "
                f"({', '.join(averages) or 'the run had no reference=ewma'}); it needs exactly one"
            )
        (state,) = averages.values()
        return {name.removeprefix("policy."): tensor for name, tensor in state["average"].items()}


def read_checkpoint(path: str | Path) -> RunCheckpoint:
    """The checkpoint at `path`, refused unless this library wrote it.

    Raises:
        FileNotFoundError: no such file.
        NotOurCheckpointError: a file that is not a checkpoint of `AsyncRLModule`.
    """
    location = Path(path).expanduser()
    if not location.is_file():
        raise FileNotFoundError(f"CKPT={path}: no such checkpoint file")
    try:
        raw = torch.load(location, map_location="cpu", weights_only=False, mmap=True)
    except Exception as error:
        raise NotOurCheckpointError(f"CKPT={path}: not a checkpoint torch can read ({error})") from error
    hyper_parameters = raw.get("hyper_parameters") if isinstance(raw, dict) else None
    if (
        not isinstance(hyper_parameters, dict)
        or any(key not in hyper_parameters for key in MODULE_KEYS)
        or not any(name.startswith("policy.") for name in raw.get("state_dict", {}))
    ):
        raise NotOurCheckpointError(
            f"CKPT={path}: not a checkpoint of lit_asyncrl's AsyncRLModule (it needs the module's "
            f"hyper-parameters {', '.join(MODULE_KEYS)} and the policy's tensors)"
        )
    return RunCheckpoint(location, raw, dict(hyper_parameters))


def restored_policy(checkpoint: RunCheckpoint) -> torch.nn.Module:
    """The policy as the run had it at save time (in fp32, on the CPU, in eval mode)."""
    from lit_asyncrl.module import AsyncRLModule

    module = AsyncRLModule.load_from_checkpoint(checkpoint.path, map_location="cpu", weights_only=False)
    return module.policy.eval()
