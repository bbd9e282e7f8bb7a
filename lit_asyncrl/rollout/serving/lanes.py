"""The rollout service's lanes: each an engine and the producer that generates on it.

A lane's engine is launched early (its start overlaps the warm start), made once more if its start
hangs, brought up with the latest weights, and replaced when it dies; its producer follows it, keeping
the counts of the one before.
New groups go to the least loaded lane (`LeastLoadedRouter`) and stay there.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from lit_asyncrl.rollout.engine.protocol import Engine, EngineStartTimeout
from lit_asyncrl.rollout.queue.producer import RolloutProducer
from lit_asyncrl.rollout.serving.routing import LeastLoadedRouter


class EngineLanes:
    """`count` lanes; `new_engine(initial_version)` makes and launches one lane's engine."""

    def __init__(self, count: int, new_engine: Callable[[int], Engine]) -> None:
        self.count = count
        self.new_engine = new_engine
        #: One engine and one producer per lane (None before a lane is up and after `close`).
        self.engines: list[Engine | None] = [None] * count
        self.producers: list[RolloutProducer | None] = [None] * count
        #: Engines launched by `launch_early`, taken over by `engine_up`.
        self.early_engines: list[Engine | None] = [None] * count
        self.router = LeastLoadedRouter()

    def live_versions(self, trainer_version: int, oldest_pending: int | None) -> list[int]:
        """From the oldest version a pending or in-flight token may carry to the newest (the
        trainer's or an engine's)."""
        newest = max([trainer_version, *(engine.version for engine in self.live_engines())])
        in_flight = [producer.oldest_in_flight_version for producer in self.producers if producer is not None]
        candidates = [version for version in (oldest_pending, *in_flight) if version is not None]
        return list(range(min(candidates, default=newest), newest + 1))

    @property
    def started(self) -> bool:
        return any(engine is not None for engine in self.engines)

    def name(self, lane: int) -> str:
        """How messages name lane `lane`'s engine ("the vLLM engine 1"; no number for one engine)."""
        return f"the vLLM engine {lane}" if self.count > 1 else "the vLLM engine"

    def launch_early(self) -> None:
        """Launch every lane's engine that is neither up nor launched, at version 0 (`engine_up`
        loads the trainer's weights before the first request)."""
        for lane in range(self.count):
            if self.engines[lane] is None and self.early_engines[lane] is None:
                self.early_engines[lane] = self.new_engine(0)

    def engine_up(self, lane: int, version: int) -> Engine:
        """Lane `lane`'s engine serving requests: the one launched early, or a new one at `version`."""
        engine = self.early_engines[lane]
        self.early_engines[lane] = None
        if engine is None:  # a restart
            engine = self.new_engine(version)
        self.engines[lane] = engine
        try:
            engine.wait_until_serving()
        except EngineStartTimeout as error:
            # A start that hangs has nothing at stake (no episode ran on it): made once more, and named.
            self.engines[lane] = None
            engine.shutdown()
            warnings.warn(f"{self.name(lane)} did not start; making it once more: {error}", stacklevel=2)
            engine = self.new_engine(version)
            self.engines[lane] = engine
            engine.wait_until_serving()
        return engine

    def producer_up(self, lane: int, producer: RolloutProducer, train: bool) -> None:
        """`producer` generates on lane `lane` from now on (started when `train`), keeping the counts
        of the producer it replaces."""
        previous = self.producers[lane]
        if previous is not None:
            producer.carry_counts_from(previous)
        self.producers[lane] = producer
        self.router.register(lane, lambda: producer.in_flight_groups)
        if train:
            producer.start()

    def take_down(self, lane: int) -> tuple[int, int]:
        """Stop lane `lane`'s producer and shut its (dead) engine down; returns the episodes it was
        generating and its groups in flight, which the caller accounts for."""
        engine = self.engines[lane]
        producer = self.producers[lane]
        lost = len(producer.active) if producer is not None else 0
        try:
            if producer is not None:  # cancels the dead engine's groups on its loop, if it still runs
                producer.stop_before_shutdown(engine_answers=engine is not None and engine.loop.is_running())
        finally:
            if engine is not None:
                engine.shutdown()
        self.engines[lane] = None
        return lost, producer.in_flight_groups if producer is not None else 0

    def close(self, between: Callable[[], None]) -> None:
        """Stop every producer, then call `between` (what must stop before the engines), then shut
        every engine down, launched-only ones included; every step runs whatever the one before did."""
        producers = self.producers
        engines = [engine or early for engine, early in zip(self.engines, self.early_engines)]
        self.producers = [None] * self.count
        self.engines = [None] * self.count
        self.early_engines = [None] * self.count
        try:
            for producer, engine in zip(producers, engines):
                if producer is not None:
                    producer.stop_before_shutdown(engine_answers=engine is not None and engine.dead_reason() is None)
        finally:
            try:
                between()
            finally:
                for engine in engines:
                    if engine is not None:
                        engine.shutdown()

    def dead_engines(self) -> list[tuple[int, str]]:
        """(lane, why) for every lane whose engine died."""
        reasons = [
            (lane, engine.dead_reason() if engine is not None else None) for lane, engine in enumerate(self.engines)
        ]
        return [(lane, reason) for lane, reason in reasons if reason is not None]

    def live_engines(self) -> list[Engine]:
        return [engine for engine in self.engines if engine is not None]


def lane_share(total: int, lane: int, lanes: int, minimum: int = 0) -> int:
    """Lane `lane`'s part of `total` dealt over `lanes` (the first lanes take the remainder)."""
    return max(minimum, total // lanes + (1 if lane < total % lanes else 0))
