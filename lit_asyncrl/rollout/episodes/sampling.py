"""How the policy's turns are sampled: the settings every request of an episode shares."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """The sampling distribution of the policy's turns, the same for every turn of a run's episodes.

    The trainer and the old-logit scorers compute log-probs under the same settings (the engine's
    log-probs are those of the distribution it samples from). What differs from turn to turn is the
    runner's to work out: a turn's `max_tokens` (what is left of the turn's budget and of the
    context) and its stop tokens (the episode format's).

    Attributes:
        temperature: the softmax temperature the tokens are sampled at (1 = the model's distribution).
        top_k: sample among the `top_k` likeliest tokens only; -1 = among all of them, 1 = greedy.
    """

    temperature: float
    top_k: int


#: Greedy decoding, as top-1 sampling (held-out evaluation's greedy episode).
GREEDY = SamplingSettings(temperature=1.0, top_k=1)
