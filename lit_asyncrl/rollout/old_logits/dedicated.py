"""The dedicated old-logit model: a worker process that holds the version the engine serves and
scores tokens while that version is alive (paper section 5.1), overlapping with training.

Messages to the worker are handled in order, so all of version v's tokens (sent at the push that
ends v, including partial turns) are scored before the weights of v+1 are loaded: the worker
"finishes a version's tokens before it moves to the next". Finished groups are scored before they
enter the buffer, so every batch arrives with pi_old attached.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.old_logits.scoring import ScoreRequest, attach, collect_unscored
from lit_asyncrl.rollout.records import Trajectory


class DedicatedScorer:
    """The worker's side: holds one version's weights, scores token lists with them.

    Messages: ("weights", version, state_dict) loads a version (no reply); ("score", request_id,
    token_lists, position_lists, temperature, top_k, pad_id) replies (request_id, version, scores,
    seconds). Runs in a process of its own (`DedicatedWorkerProcess`) or in a Ray actor (`DedicatedWorkerActor`).
    With LoRA adapters as versions (`lora.serves_adapters`) it holds the base model with the
    adapter, and a version's state dict is the adapter's tensors alone.
    """

    def __init__(self, model_path: str, num_threads: int, lora: LoRASettings = LoRASettings()) -> None:
        from transformers import AutoModelForCausalLM

        from lit_asyncrl.models.checkpoint_names import CheckpointLayout
        from lit_asyncrl.models.lora import add_adapter

        torch.set_num_threads(num_threads)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.adapter = lora.serves_adapters
        if self.adapter:
            self.model = add_adapter(self.model, lora)
        self.model.eval()  # after the adapter: peft's new layers start in training mode
        # Versions come as the engine takes them, under the checkpoint's names (`models/checkpoint_names.py`).
        self.layout = None if self.adapter else CheckpointLayout(self.model)
        self.version: int | None = None

    def handle(self, message: tuple) -> tuple | None:
        from lit_asyncrl.rollout.old_logits.scoring import model_score_fn, score_requests

        if message[0] == "weights":
            _, self.version, state_dict = message
            if self.adapter:
                from peft import set_peft_model_state_dict

                unexpected = set_peft_model_state_dict(self.model, state_dict).unexpected_keys
                if unexpected:
                    raise ValueError(
                        f"the adapter of version {self.version} has tensors the worker's adapter lacks: "
                        f"{unexpected[:3]}"
                    )
            else:
                self.layout.load(self.model, state_dict)
            return None
        _, request_id, token_lists, position_lists, temperature, top_k, pad_id = message
        start = time.perf_counter()
        requests = [ScoreRequest(None, tokens, positions) for tokens, positions in zip(token_lists, position_lists)]
        scores = score_requests(
            model_score_fn(self.model), requests, temperature=temperature, top_k=top_k, pad_id=pad_id
        )
        return (request_id, self.version, scores, time.perf_counter() - start)


def _worker_main(model_path: str, inbox: mp.Queue, outbox: mp.Queue, num_threads: int, lora: LoRASettings) -> None:
    """Worker process: handle messages in order until told to stop."""
    scorer = DedicatedScorer(model_path, num_threads, lora)
    while True:
        message = inbox.get()
        if message[0] == "stop":
            return
        reply = scorer.handle(message)
        if reply is not None:
            outbox.put(reply)


class DedicatedWorkerProcess:
    """The scorer in a spawned process on this machine, reached through two queues."""

    def __init__(self, model_path: str, num_threads: int, lora: LoRASettings = LoRASettings()) -> None:
        context = mp.get_context("spawn")
        self._inbox = context.Queue()
        self._outbox = context.Queue()
        self._process = context.Process(
            target=_worker_main, args=(model_path, self._inbox, self._outbox, num_threads, lora), daemon=True
        )
        self._process.start()

    def send(self, message: tuple) -> None:
        self._inbox.put(message)

    def reply(self, timeout_s: float) -> tuple | None:
        """The next reply, in order; None if none came within `timeout_s`."""
        try:
            return self._outbox.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def dead_reason(self) -> str | None:
        if not self._process.is_alive():
            return f"the dedicated old-logit worker (pid {self._process.pid}) exited with code {self._process.exitcode}"
        return None

    def stop(self) -> None:
        if self._process.is_alive():
            self._inbox.put(("stop",))
            self._process.join(timeout=10)
        if self._process.is_alive():  # stuck in a forward: it holds no state worth saving
            self._process.kill()
            self._process.join(timeout=5)
        for channel in (self._inbox, self._outbox):
            channel.cancel_join_thread()  # never block exit on unread messages
            channel.close()


class DedicatedWorker:
    """Main-process side: sends weights and score requests, attaches replies on the engine loop.

    Args:
        model_path: the model folder the worker loads.
        sampling: the engine's sampling settings, under which the worker scores (as the trainer does).
        pad_id: the token that pads the worker's batches.
        num_threads: the worker's torch threads.
        lora: the adapter's settings when versions are LoRA adapters (`lora.serves_adapters`).
        worker_factory: makes the worker from (model path, threads, LoRA settings): a process here,
            or a Ray actor.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        sampling: SamplingSettings,
        pad_id: int,
        num_threads: int = 1,
        lora: LoRASettings = LoRASettings(),
        worker_factory: Callable[[str, int, LoRASettings], Any] = DedicatedWorkerProcess,
    ) -> None:
        self.model_path = str(model_path)
        self.num_threads = num_threads
        self.worker_factory = worker_factory
        self.lora = lora
        self.sampling = sampling
        self.pad_id = pad_id
        self._ids = itertools.count()
        self._waiting: dict[int, tuple[list[ScoreRequest], asyncio.Future | None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.version: int | None = None
        self.scored_tokens = 0
        self.score_seconds = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the worker (`worker_factory`: a process here, or a Ray actor) and its reply reader."""
        self._loop = loop
        self._worker = self.worker_factory(self.model_path, self.num_threads, self.lora)
        self._stopping = False
        self._reader = threading.Thread(target=self._read_replies, name="old-logit-replies", daemon=True)
        self._reader.start()

    def stop(self) -> None:
        """Stop the worker and the reply reader; safe to call twice or after a crash."""
        worker = getattr(self, "_worker", None)
        self._worker = None
        if worker is None:
            return
        self._stopping = True
        self._reader.join(timeout=10)
        worker.stop()

    def dead_reason(self) -> str | None:
        """Why the worker cannot score any more (None while it runs or was never started)."""
        worker = getattr(self, "_worker", None)
        return worker.dead_reason() if worker is not None else None

    @property
    def queue_depth(self) -> int:
        """Score requests sent and not answered yet."""
        return len(self._waiting)

    def send_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Queue version `version`; requests sent before it are scored with the previous weights."""
        tensors = {name: tensor.detach().to("cpu", torch.float32).clone() for name, tensor in state_dict.items()}
        self._worker.send(("weights", version, tensors))
        self.version = version

    # -- on the engine loop --------------------------------------------------------------------
    def submit(self, trajectories: Iterable[Trajectory]) -> asyncio.Future | None:
        """Send every unscored token of `trajectories`; the future resolves once attached."""
        requests = collect_unscored(trajectories)
        if not requests:
            return None
        request_id = next(self._ids)
        future = self._loop.create_future()
        self._waiting[request_id] = (requests, future)
        token_lists = [r.token_ids for r in requests]
        position_lists = [r.positions for r in requests]
        self._worker.send(
            (
                "score",
                request_id,
                token_lists,
                position_lists,
                self.sampling.temperature,
                self.sampling.top_k,
                self.pad_id,
            )
        )
        return future

    def _read_replies(self) -> None:
        worker = self._worker
        while not self._stopping:
            reply = worker.reply(timeout_s=0.2)
            if reply is not None:
                self._loop.call_soon_threadsafe(self._attach, *reply)

    def _attach(self, request_id: int, version: int, scores: list[list[float]], seconds: float) -> None:
        requests, future = self._waiting.pop(request_id)
        attached = attach(requests, scores, version)
        self.scored_tokens += attached
        self.score_seconds += seconds
        if future is not None and not future.done():
            future.set_result(attached)
