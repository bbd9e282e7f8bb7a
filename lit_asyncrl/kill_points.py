"""Kill points for crash tests: a run started with `LIT_ASYNCRL_KILL_AT=<point>@<step>` SIGKILLs
itself when it reaches that point at that optimizer step, so a test can kill a run at a moment no
outside signal can hit reliably (the engine paused in the middle of a weight push, a checkpoint
being made).

Points, each at the optimizer step (the trainer's global step) it names: `weight_push` (the file
route: the new version's weights file written, not yet loaded; the weight-transfer routes: the
engine paused, the weights not yet sent), `checkpoint_write` (the checkpoint's contents being
gathered, before its file is written), `train_step` (in the training step, its batch taken) and
`batch_wait` (about to wait for the step's batch). Several are separated by commas. Unset, nothing
happens.
"""

from __future__ import annotations

import os
import signal

KILL_AT = "LIT_ASYNCRL_KILL_AT"
POINTS = ("weight_push", "checkpoint_write", "train_step", "batch_wait")


def kill_points(spec: str) -> set[tuple[str, int]]:
    """`weight_push@5,checkpoint_write@8` -> {("weight_push", 5), ("checkpoint_write", 8)}.

    Raises:
        ValueError: naming the variable and the part it cannot read.
    """
    points = set()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, _, step = item.partition("@")
        if point not in POINTS or not step.isdigit():
            raise ValueError(
                f"{KILL_AT}={spec!r}: {item!r} is not <point>@<step> with a point among {', '.join(POINTS)}"
            )
        points.add((point, int(step)))
    return points


def kill_if_asked(point: str, step: int) -> None:
    """SIGKILL this process when `LIT_ASYNCRL_KILL_AT` names `point` at `step`."""
    spec = os.environ.get(KILL_AT)
    if spec and (point, step) in kill_points(spec):
        os.kill(os.getpid(), signal.SIGKILL)
