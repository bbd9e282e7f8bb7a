"""The weight-route protocol: how one engine receives each version's weights.

A route knows what engine arguments it needs, which tensors of a version travel, how they travel
and what the push took (`WeightPush`). Every route is a class of `WeightRoute`, chosen once from the
settings (`choice.py`, the one place that reads a route's name); the local engine and the Ray engine
both push through the route they were given and never branch on which one it is.

The engine's side of a push stays in the engine: a route asks it to stand still (`pause`), to
load a version from a file (`load_version`, pause -> load -> label -> resume, all on the engine's
loop), to take a new label (`set_version`) or to carry on (`resume`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from lit_asyncrl.rollout.weights.changed_tensors import TensorSelection


@dataclasses.dataclass(frozen=True)
class WeightPush:
    """What one push took, in seconds, and what it sent.

    `write_s`: work while the engine still generates (writing, staging); `pause_s`: the time the
    engine stood still; `bytes`: what the engine loads; `moved_turns`: with LoRA adapters moving
    turns in flight (`model.lora.in_flight=move`), the turns moved to the new adapter (None otherwise).
    """

    write_s: float = 0.0
    pause_s: float = 0.0
    bytes: int = 0
    moved_turns: int | None = None


def pushed_one_after_another(pushes: list[WeightPush]) -> WeightPush:
    """One version pushed to several engines in turn: each stands still only for its own push, and
    each loads the same bytes."""
    moved = [push.moved_turns for push in pushes if push.moved_turns is not None]
    return WeightPush(
        write_s=sum(push.write_s for push in pushes),
        pause_s=max((push.pause_s for push in pushes), default=0.0),
        bytes=pushes[-1].bytes if pushes else 0,
        moved_turns=sum(moved) if moved else None,
    )


class WeightRoute(abc.ABC):
    """How one engine receives each version's weights (one instance per engine).

    Args:
        selection: which tensors of a version travel (those written since the last push, or all).
    """

    def __init__(self, selection: TensorSelection) -> None:
        self.selection = selection

    def engine_arguments(self) -> dict[str, Any]:
        """vLLM engine arguments (`AsyncEngineArgs` fields) the engine needs to take this route."""
        return {}

    def push(self, engine: Any, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        """Load `state_dict` into `engine` as `version`: only what `selection` picks travels; when
        nothing does, only the label moves."""
        tensors = self.selection.select(state_dict)
        if not tensors:
            engine.set_version(version)
            return WeightPush()
        pushed = self.send(engine, tensors, version)
        self.selection.sent(state_dict)
        return pushed

    @abc.abstractmethod
    def send(self, engine: Any, tensors: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        """Bring `tensors` into `engine` and label what it samples from then on `version`."""

    def close(self) -> None:  # noqa: B027 (most routes hold nothing to release)
        """Release what the route holds (connections, groups); the engine calls it at its shutdown."""
