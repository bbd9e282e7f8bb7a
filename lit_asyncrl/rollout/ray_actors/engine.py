"""A vLLM engine as a Ray actor, here or on a cluster node.

`RayEngine` implements the `Engine` protocol (`engine_protocol.py`) as `VLLMEngine` does, so the
rollout service, its producers and its buffer stay in the trainer's process unchanged: episodes
run on a local event loop and each turn streams from the actor. Inside the actor an ordinary
`VLLMEngine` samples, tags every token with its version and pushes weights in place, so
per-token versions are exactly those of the in-process engines.

Ray is an extra (`pip install "lit-asyncrl[ray]"`); nothing here imports it before an actor starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lit_asyncrl.rollout.engine.protocol import (
    EngineDeadError,
    EngineLoop,
    EngineStartTimeout,
    TurnOutput,
    cancel_other_tasks,
)
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.rollout.processes.temp_dirs import remove_run_dir
from lit_asyncrl.rollout.ray_actors.placement import RAY_RUNTIME, RayPlacement
from lit_asyncrl.rollout.weights.choice import actor_route
from lit_asyncrl.rollout.weights.route import WeightPush


@dataclasses.dataclass(frozen=True)
class TurnRequest:
    """How to sample one turn: `VLLMEngine.generate`'s sampling arguments, sent to the actor with the
    prompt (the `on_tokens` callback stays here: the actor streams each piece back instead)."""

    max_tokens: int
    temperature: float
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


class EngineActor:
    """The Ray actor's body: a `VLLMEngine` started in the actor process (made a Ray actor class at launch)."""

    def __init__(
        self, model_path: str, settings: EngineSettings, initial_version: int, seed: int, max_loras: int
    ) -> None:
        self.engine = VLLMEngine(model_path, settings, seed=seed, max_loras=max_loras)
        self.engine.start(initial_version)
        #: Streamed pieces the engine has produced, all turns together (see `RayEngine.pause`).
        self.pieces_produced = 0

    def ready(self) -> bool:
        return True

    async def generate_stream(self, prompt_ids: Sequence[int], request: TurnRequest):
        """Yields ("tokens", ids, logprobs) as the turn streams, then ("turn", TurnOutput)."""
        pieces: asyncio.Queue = asyncio.Queue()
        here = asyncio.get_running_loop()

        def on_tokens(ids: list[int], logprobs: list[float]) -> None:  # on the engine's loop
            self.pieces_produced += 1
            here.call_soon_threadsafe(pieces.put_nowait, ("tokens", ids, logprobs))

        generating = self.engine.generate(
            prompt_ids,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_k=request.top_k,
            stop_token_ids=request.stop_token_ids,
            ignore_eos=request.ignore_eos,
            on_tokens=on_tokens,
        )
        turn = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(generating, self.engine.loop))
        try:
            while not (turn.done() and pieces.empty()):
                piece = asyncio.ensure_future(pieces.get())
                await asyncio.wait({piece, turn}, return_when=asyncio.FIRST_COMPLETED)
                if piece.done():
                    yield piece.result()
                else:
                    piece.cancel()
            yield ("turn", turn.result())
        finally:
            turn.cancel()

    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        return self.engine.push_weights(state_dict, version)

    # vLLM's weight-sync control plane under the names its `RayVLLMWeightSyncClient` calls, so
    # the trainer drives this actor's engine through vLLM's own client (`RayEngine.push_weights`).
    def init_weight_transfer_engine(self, request: Any) -> None:
        self.engine.weight_sync_client().init_weight_transfer_engine(request.init_info)

    def start_weight_update(self) -> None:
        self.engine.weight_sync_client().start_weight_update()

    def update_weights(self, request: Any) -> None:
        self.engine.weight_sync_client().update_weights(request.update_info)

    def finish_weight_update(self) -> None:
        self.engine.weight_sync_client().finish_weight_update()

    def update_weight_version(self, version: str) -> None:
        self.engine.set_version(int(version))

    def pause(self) -> int:
        """Pause the engine; returns how many pieces it produced before (all now on their way)."""
        self.engine.pause()
        return self.pieces_produced

    def resume(self) -> None:
        self.engine.resume()

    def dead_reason(self) -> str | None:
        return self.engine.dead_reason()

    def shutdown(self) -> None:
        self.engine.shutdown()
        remove_run_dir()  # the actor is killed next, without its exit handlers


class RayEngine(EngineLoop):
    """A proxy for a `VLLMEngine` in a Ray actor (see the module docstring).

    Args:
        model_path: the model folder, readable where the actor runs (a shared path on a cluster).
        settings: the engine's settings, as for `VLLMEngine`.
        placement: the Ray cluster and each actor's resource request.
    """

    #: How often `dead_reason` asks the actor (liveness polls come every half second).
    health_check_s = 1.0

    def __init__(
        self,
        model_path: str | Path,
        settings: EngineSettings = EngineSettings(),
        placement: RayPlacement = RayPlacement(),
        *,
        seed: int = 0,
        max_loras: int = 4,
    ) -> None:
        self.model_path = str(model_path)
        self.settings = settings
        self.placement = placement
        self.seed = seed
        self.max_loras = max_loras
        self.version = 0
        self._actor: Any = None
        self._ready_ref: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runtime_held = False
        self._dead: str | None = None
        self._checked_at = 0.0
        #: Streamed pieces added to their trajectories here (on the local loop).
        self._pieces_received = 0
        #: vLLM's weight-transfer API from this process, or Ray's object store to the actor's engine.
        self._route = actor_route(settings)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, initial_version: int = 0, timeout_s: float = 300.0) -> None:
        self.launch(initial_version)
        self.wait_until_serving(timeout_s)

    def launch(self, initial_version: int = 0) -> None:
        """Ask Ray for the actor (its engine starts inside it) and start the local episode loop."""
        import ray

        self.version = initial_version
        RAY_RUNTIME.acquire(self.placement.address)
        self._runtime_held = True
        actor_class = ray.remote(EngineActor)
        self._actor = actor_class.options(num_cpus=self.placement.num_cpus, num_gpus=self.placement.num_gpus).remote(
            self.model_path, self.settings, initial_version, self.seed, self.max_loras
        )
        self._ready_ref = self._actor.ready.remote()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ray-engine-episodes", daemon=True)
        self._thread.start()

    def wait_until_serving(self, timeout_s: float = 300.0) -> None:
        import ray

        try:
            ray.get(self._ready_ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise EngineStartTimeout(f"the vLLM engine's Ray actor did not start within {timeout_s} s") from None
        except ray.exceptions.RayError as error:
            raise RuntimeError("vLLM engine failed to start in its Ray actor") from error

    def shutdown(self, startup_timeout_s: float = 300.0) -> None:
        """Stop the actor's engine, the actor and the local loop; release Ray. Safe to call twice."""
        import ray

        actor = self._actor
        self._actor = None
        try:
            self._route.close()
            if actor is not None:
                try:
                    ray.get(actor.shutdown.remote(), timeout=60)
                except ray.exceptions.RayError:
                    pass  # a dead actor has nothing left to stop
                finally:
                    ray.kill(actor)
            if self._loop is not None and self._loop.is_running():
                asyncio.run_coroutine_threadsafe(cancel_other_tasks(), self._loop).result(timeout=30)
                self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30)
                self._thread = None
            if self._loop is not None and not self._loop.is_closed():
                self._loop.close()
        finally:
            if self._runtime_held:
                self._runtime_held = False
                RAY_RUNTIME.release()

    def dead_reason(self) -> str | None:
        """Why the engine cannot serve any more: its actor died, or its engine reports why."""
        import ray

        if self._actor is None or self._dead is not None:
            return self._dead
        now = time.monotonic()
        if now - self._checked_at < self.health_check_s:
            return None
        self._checked_at = now
        try:
            self._dead = ray.get(self._actor.dead_reason.remote(), timeout=10)
        except ray.exceptions.GetTimeoutError:
            return None  # busy, not dead: a stalled engine reports itself through its own check
        except ray.exceptions.RayError as error:
            self._dead = f"its Ray actor died ({type(error).__name__})"
        return self._dead

    # -- generation (called inside the local loop) ------------------------------------------
    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float,
        top_k: int = -1,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        on_tokens: Callable[[list[int], list[float]], None] | None = None,
    ) -> TurnOutput:
        """`VLLMEngine.generate` (the same sampling arguments), sampled by the actor's engine and
        streamed here piece by piece."""
        request = TurnRequest(
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            stop_token_ids=tuple(stop_token_ids),
            ignore_eos=ignore_eos,
        )
        stream = self._actor.generate_stream.options(num_returns="streaming").remote(list(prompt_ids), request)
        async for reference in stream:
            piece = await reference
            if piece[0] == "tokens":
                if on_tokens is not None:
                    on_tokens(piece[1], piece[2])
                self._pieces_received += 1
            else:
                return piece[1]
        raise EngineDeadError("the vLLM engine's Ray actor ended a turn without its result")

    # -- weights (called from the trainer thread) --------------------------------------------
    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        """The actor's engine loads `state_dict` in place as `version`, by this engine's route: over
        vLLM's weight-transfer API, driven through vLLM's Ray client, or through Ray's object store."""
        import ray

        try:
            return self._route.push(self, state_dict, version)
        except ray.exceptions.RayError as error:
            raise EngineDeadError(
                f"the vLLM engine died: its Ray actor failed a weight push ({type(error).__name__})"
            ) from error

    def push_in_actor(self, tensors: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        """Hand `tensors` (on the CPU) to the actor's engine, which pushes them by its own route."""
        import ray

        try:
            pushed = ray.get(
                self._actor.push_weights.remote(tensors, version), timeout=self.settings.engine_stall_timeout_s
            )
        except ray.exceptions.GetTimeoutError:
            raise EngineDeadError(
                "the vLLM engine stopped answering: a weight push got no answer within "
                f"{self.settings.engine_stall_timeout_s:g} s"
            ) from None
        self.version = version
        return pushed

    def weight_sync_client(self) -> Any:
        """vLLM's weight-sync client of the actor's engine (the actor answers under vLLM's names)."""
        from vllm.distributed.weight_transfer import RayVLLMWeightSyncClient

        return RayVLLMWeightSyncClient(self._actor)

    def trainer_address(self) -> str:
        """Where the actor's engine reaches the trainer: on a cluster the actor may be on another
        node, so it joins the trainer's rendezvous at this node's address."""
        import ray

        return "127.0.0.1" if self.placement.address is None else ray.util.get_node_ip_address()

    def set_version(self, version: int) -> None:
        """Label what the actor's engine samples from now on `version`."""
        self.version = version
        self._call("update_weight_version", str(version))

    def pause(self) -> None:
        """Pause the actor's engine, then wait here until every piece it streamed before the pause
        has reached its trajectory: a route that scores unfinished tokens at a pause (dedicated,
        interruption-sync) must see them all, as it does with an engine in this process."""
        produced = self._call("pause")

        async def caught_up() -> None:
            while self._pieces_received < produced:
                await asyncio.sleep(0.002)

        self.run(caught_up(), timeout_s=self.settings.engine_stall_timeout_s, stalled="the stream after a pause")

    def resume(self) -> None:
        self._call("resume")

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return ray.get(getattr(self._actor, method).remote(*args), timeout=self.settings.engine_stall_timeout_s)
        except ray.exceptions.RayError as error:
            raise EngineDeadError(
                f"the vLLM engine died: its Ray actor failed a {method} ({type(error).__name__})"
            ) from error
