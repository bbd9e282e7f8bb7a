"""The dedicated old-logit worker's scorer in a Ray actor, behind the transport interface of its
local process (`dedicated.DedicatedWorkerProcess`)."""

from __future__ import annotations

import collections
import time
from typing import Any

from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedScorer
from lit_asyncrl.rollout.ray_actors.placement import RAY_RUNTIME, RayPlacement


class DedicatedWorkerActor:
    """The dedicated old-logit scorer in a Ray actor (the interface of `dedicated.DedicatedWorkerProcess`).

    A Ray actor runs one caller's calls in the order they were made, so a version's score
    requests are answered before the next version's weights load, as with the process's queue;
    replies are read back in the same order.
    """

    def __init__(
        self,
        model_path: str,
        num_threads: int,
        lora: LoRASettings = LoRASettings(),
        placement: RayPlacement = RayPlacement(),
    ) -> None:
        import ray

        RAY_RUNTIME.acquire(placement.address)
        self._runtime_held = True
        actor_class = ray.remote(DedicatedScorer)
        self._actor = actor_class.options(num_cpus=placement.num_cpus, num_gpus=placement.num_gpus).remote(
            model_path, num_threads, lora
        )
        self._replies: collections.deque = collections.deque()  # refs of score requests, in order
        self._dead: str | None = None
        self._probe: Any = None  # an outstanding liveness check (answered after queued requests)

    def send(self, message: tuple) -> None:
        reference = self._actor.handle.remote(message)
        if message[0] == "score":
            self._replies.append(reference)

    def reply(self, timeout_s: float) -> tuple | None:
        import ray

        if not self._replies:
            time.sleep(timeout_s)
            return None
        ready, _ = ray.wait([self._replies[0]], timeout=timeout_s)
        if not ready:
            return None
        reference = self._replies.popleft()
        try:
            return ray.get(reference)
        except ray.exceptions.RayError as error:
            self._dead = f"the dedicated old-logit worker's Ray actor failed ({type(error).__name__}: {error})"
            return None

    def dead_reason(self) -> str | None:
        """Why the actor cannot score any more; a kill is seen at the latest when its queue drains."""
        import ray

        if self._dead is not None or self._actor is None:
            return self._dead
        if self._probe is None:
            self._probe = self._actor.__ray_ready__.remote()
        ready, _ = ray.wait([self._probe], timeout=0)
        if ready:
            probe = self._probe
            self._probe = None
            try:
                ray.get(probe)
            except ray.exceptions.RayError as error:
                self._dead = f"the dedicated old-logit worker's Ray actor died ({type(error).__name__})"
        return self._dead

    def stop(self) -> None:
        import ray

        actor = self._actor
        self._actor = None
        if actor is not None:
            ray.kill(actor)
        if self._runtime_held:
            self._runtime_held = False
            RAY_RUNTIME.release()
