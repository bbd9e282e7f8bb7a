"""Asynchrony's payoff: trained tokens per second, async against sync, at simulated tool latency.

The same model (the tiny policy after its warm start), engine, task (guess-the-number: up to four
agent turns, so five environment answers per episode), batch and group sizes; only `rollout.mode`
differs. Each environment answer (reset and every step) waits `env.latency_s`. Sync generates
exactly one batch per weight version and then waits for the trainer; async keeps generating while
the trainer trains, with up to `buffer_capacity / batch` batches pending or in flight (3 here)
and tokens at most `max_version_gap` (3) versions old.

Each setting is a real Lightning fit through `lit_asyncrl.train` (warm start, engine, trainer);
throughput is measured from the end of step `--skip` to the last step: trained policy tokens over
wall seconds. The version gaps of the trained tokens are counted over the same steps.

Usage::

    python benchmarks/bench_async_vs_sync.py            # latencies 0, 50, 200, 500 ms, 24 steps each
    python benchmarks/bench_async_vs_sync.py --quick    # 0 and 200 ms, 12 steps each
    python benchmarks/bench_async_vs_sync.py --quick --batches-in-flight 4   # async may run further ahead

Beside the throughput, each setting prints the share of the measured wall time the trainer spent
waiting for its batch (the rest is its own step: forward, backward, update, weight push), and the
share of generated episodes dropped as too stale. The last line reads `async/sync at 200 ms: <ratio>x`.
"""

from __future__ import annotations

import argparse
import collections
import time

import lightning as L

GROUP_SIZE, GROUPS_PER_BATCH = 8, 8


class ThroughputMeter(L.Callback):
    """Trained policy tokens and wall time from the end of step `skip`; version-gap counts."""

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.tokens = 0
        self.started: float | None = None
        self.ended: float | None = None
        self.gaps: collections.Counter[int] = collections.Counter()
        self.batch_wait_s = 0.0  # the trainer waiting in `next_batch`, over the measured steps
        self.produced = self.dropped_stale = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        rollouts = trainer.datamodule.rollouts
        next_batch = rollouts.next_batch

        def timed_next_batch(timeout_s: float) -> dict:
            started = time.perf_counter()
            batch = next_batch(timeout_s)
            if self.started is not None:
                self.batch_wait_s += time.perf_counter() - started
                # The version gaps of the policy tokens this step trains on (the module logs its per-gap
                # buckets to the loggers only, and this run has none).
                gaps = trainer.global_step - batch["versions"][batch["loss_mask"]]
                self.gaps.update(gaps.tolist())
            return batch

        rollouts.next_batch = timed_next_batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # The module pulls its own batch (dataloader_iter): read what it trained on from its logged metrics.
        step = trainer.global_step
        if step == self.skip:
            self.started = time.perf_counter()
        elif step > self.skip:
            metrics = trainer.callback_metrics
            self.tokens += int(metrics["train/policy_tokens"])
            self.ended = time.perf_counter()
            self.produced, self.dropped_stale = (
                float(metrics["rollout/produced"]),
                float(metrics["rollout/dropped_stale"]),
            )

    @property
    def wait_share(self) -> float:
        return self.batch_wait_s / (self.ended - self.started)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.ended - self.started)


def run_setting(mode: str, latency_s: float, steps: int, skip: int, batches_in_flight: int) -> ThroughputMeter:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from lit_asyncrl.config_dir import config_dir
    from lit_asyncrl.lifecycle import quiet_known_warnings
    from lit_asyncrl.warm_start import load_tokenizer

    overrides = [
        f"rollout.mode={mode}",
        f"env.latency_s={latency_s}",
        f"rollout.group_size={GROUP_SIZE}",
        f"rollout.groups_per_batch={GROUPS_PER_BATCH}",
        f"rollout.buffer_capacity={batches_in_flight * GROUP_SIZE * GROUPS_PER_BATCH}",
        f"rollout.max_concurrent_groups={batches_in_flight * GROUPS_PER_BATCH}",
        f"trainer.max_steps={steps}",
        "trainer.num_sanity_val_steps=0",
        "trainer.val_check_interval=100000",
        "+trainer.enable_progress_bar=false",
        "+trainer.enable_model_summary=false",
        "trainer.logger=false",
        "trainer.enable_checkpointing=false",
        "trainer.callbacks=[]",
        "trainer.default_root_dir=/tmp/bench_async_vs_sync",
    ]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    quiet_known_warnings()
    L.seed_everything(cfg.seed, verbose=False)
    module = instantiate(cfg.module, _convert_="all")
    datamodule = instantiate(cfg.data, _convert_="all")
    meter = ThroughputMeter(skip)
    trainer = instantiate(cfg.trainer, _convert_="all", callbacks=[meter])
    instantiate(cfg.warm_start, _convert_="all").run(
        module.policy, datamodule.env, load_tokenizer(datamodule.model_path), enable_progress_bar=False
    )
    try:
        trainer.fit(module, datamodule=datamodule)
    finally:
        datamodule.rollouts.close()
    return meter


def gap_summary(gaps: collections.Counter[int]) -> str:
    total = sum(gaps.values()) or 1
    return " ".join(f"{gap}:{count / total:.2f}" for gap, count in sorted(gaps.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="latencies 0 and 200 ms, 12 steps")
    parser.add_argument("--steps", type=int, default=None, help="steps per setting (default 24, quick 12)")
    parser.add_argument("--skip", type=int, default=3, help="steps before the measurement starts (warm-up)")
    parser.add_argument("--batches-in-flight", type=int, default=3, help="async: batches pending or in flight at most")
    args = parser.parse_args()
    latencies_ms = [0, 200] if args.quick else [0, 50, 200, 500]
    steps = args.steps or (12 if args.quick else 24)
    print(
        f"guess-the-number, {GROUPS_PER_BATCH} groups x {GROUP_SIZE} episodes per batch; async keeps up to {args.batches_in_flight} batches"
    )
    print(f"pending or in flight; {steps} steps per setting, measured after step {args.skip}\n")
    print(
        f"{'latency':>8} {'sync tok/s':>11} {'async tok/s':>12} {'async/sync':>11}  trainer waiting (sync, async)  stale drops (async)  version gaps of trained tokens (async)"
    )
    ratios = {}
    for latency_ms in latencies_ms:
        sync = run_setting("sync", latency_ms / 1000, steps, args.skip, args.batches_in_flight)
        asynchronous = run_setting("async", latency_ms / 1000, steps, args.skip, args.batches_in_flight)
        stale = asynchronous.dropped_stale / max(asynchronous.produced, 1.0)
        ratios[latency_ms] = asynchronous.tokens_per_s / sync.tokens_per_s
        print(
            f"{latency_ms:>6} ms {sync.tokens_per_s:>11.0f} {asynchronous.tokens_per_s:>12.0f} {ratios[latency_ms]:>10.2f}x  "
            f"{sync.wait_share:>8.2f}, {asynchronous.wait_share:.2f}  {stale:>18.2f}  "
            f"{gap_summary(asynchronous.gaps)} (sync: {gap_summary(sync.gaps)})",
            flush=True,
        )
    print("\ntarget: async at least 3x sync at 200 ms")
    print(f"async/sync at 200 ms: {ratios[200]:.1f}x")


if __name__ == "__main__":
    main()
