"""Groups and episodes that carry no learning signal (DAPO's dynamic sampling and overlong filtering).

A GRPO group whose episodes all got the same reward has advantages that are all zero: it adds tokens
to the loss's normaliser and nothing to the gradient. With `zero_advantage` on, the buffer drops such
a group with the counted reason `zero_advantage` and the producers go on generating, so the batch is
filled from further groups. A batch waits for at most `max_drops_per_batch` such drops (counted from
the last batch taken): past that, a group without signal is trained on as it is and counted as
`zero_advantage_kept`, so a task on which every group fails (or every group succeeds) still trains
instead of waiting for a batch that never comes.

An episode cut by the context (`rollout.max_model_len`) or the turn limit (`env.max_turns`) has a
reward that says where it was cut, not how it would have ended. With `overlong` on it stays in its
group (its reward counts in the group's advantages) but out of the loss, counted as `masked_overlong`.
"""

from __future__ import annotations

import dataclasses

from lit_asyncrl.rollout.records import Trajectory


@dataclasses.dataclass(frozen=True)
class GroupFilter:
    zero_advantage: bool = False
    max_drops_per_batch: int = 16
    overlong: bool = False

    def lacks_signal(self, group: list[Trajectory]) -> bool:
        """Whether `group` is one the zero-advantage filter drops (always False when it is off)."""
        return self.zero_advantage and all(trajectory.advantage == 0.0 for trajectory in group)

    def mask_overlong(self, group: list[Trajectory]) -> int:
        """Keep the episodes of `group` cut by the context or the turn limit out of the loss (when on);
        returns how many."""
        if not self.overlong:
            return 0
        cut = [trajectory for trajectory in group if trajectory.cut_off is not None]
        for trajectory in cut:
            trajectory.in_loss = False
        return len(cut)
