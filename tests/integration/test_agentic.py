"""Agentic tasks on the real engine: slow environments overlap, held-out validation is logged for
every task family (built-in, gem, reasoning-gym), and a checkpoint can be evaluated on its own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lit_asyncrl.envs import GuessNumberEnv
from tests.support.runs import SMALL_KV_CACHE, SMALL_KV_CACHE_GIB, SMALL_RUN, run_cli, run_hydra
from tests.support.small_engines import small_async_service

# One xdist worker runs this module's tests: they share module-scoped runs or engines.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("test_agentic")]

VALIDATION = [
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "rollout.eval_instances=4",
    "rollout.eval_samples=4",
]


def val_rows(run_dir) -> list[dict[str, float]]:
    import csv

    (csv_path,) = (
        run_dir.glob("**/metrics.csv") if not (run_dir / "metrics.csv").exists() else [run_dir / "metrics.csv"]
    )
    with open(csv_path, newline="") as handle:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)]
    return [row for row in rows if "val/avg@4" in row]


def test_sixteen_episodes_with_half_a_second_of_latency_overlap(tiny_model_path):
    # 16 episodes (4 groups of 4) at once; every environment answer (reset and each step) takes 0.5 s.
    # Run one after another they would take the sum of their durations; overlapped, about the longest.
    env = GuessNumberEnv(latency_s=0.5)
    service = small_async_service(tiny_model_path, env)
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    try:
        service.start(weights, version=0)
        started = time.monotonic()
        batch = service.next_batch(timeout_s=120)
        batch_s = time.monotonic() - started
    finally:
        service.close()
    durations = batch["episode_s"]
    print(
        f"\nbatch of 16 episodes: {batch_s:.2f} s; longest episode {durations.max():.2f} s; sum of episodes {durations.sum():.2f} s"
    )
    assert durations.shape == (16,)
    assert durations.min() >= 1.0  # at least the reset's and one answer's latency
    assert batch_s <= 1.5 * float(durations.max()), (batch_s, durations.tolist())


#: Configs of the tests' own (a task that only sets another task's keys), on Hydra's search path.
TEST_CONFIGS = Path(__file__).parent / "conf"
#: One held-out validation run per task family: built-in, gem and reasoning-gym.
VALIDATED_TASKS = ["service_desk", "gem_guess_the_number", "reasoning_gym"]


@pytest.fixture(scope="module")
def validation_sweep(tmp_path_factory) -> dict[str, Path]:
    """One Hydra multirun of a short run with held-out validation per task family (one process, so
    a task costs its engine and its steps, not a process start): {task: job dir}. The service
    desk's last.ckpt is evaluated on its own below."""
    sweep_dir = tmp_path_factory.mktemp("validation_sweep")
    run_hydra(
        [
            "-m",
            f"env={','.join(VALIDATED_TASKS)}",
            f"hydra.searchpath=[file://{TEST_CONFIGS}]",
            *SMALL_RUN,
            *VALIDATION,
            "rollout.max_model_len=1024",
            f"hydra.sweep.dir={sweep_dir}",
            # Named by the task alone: all the overrides above make a name longer than a file's may be.
            "hydra.sweep.subdir=${hydra.job.num}_${hydra:runtime.choices.env}",
        ],
        timeout_s=900,
    )
    return {task: sweep_dir / f"{job}_{task}" for job, task in enumerate(VALIDATED_TASKS)}


def test_a_short_run_of_each_task_family_logs_held_out_validation(validation_sweep, subtests):
    # One subtest per task family, each reported on its own.
    for task, run_dir in validation_sweep.items():
        with subtests.test(task=task):
            rows = val_rows(run_dir)
            # once before the first RL step (after the warm start) and after step 2, the interval
            assert [int(row["step"]) for row in rows] == [0, 1]
            for row in rows:
                assert 0.0 <= row["val/avg@4"] <= row["val/pass@4"] <= 1.0  # pass@k >= avg@k always
                assert 0.0 <= row["val/greedy_success"] <= 1.0
            assert (run_dir / "training_curves.png").exists()


def test_a_checkpoint_is_evaluated_on_its_own_in_both_front_ends(validation_sweep, tmp_path):
    checkpoint = validation_sweep["service_desk"] / "checkpoints" / "last.ckpt"
    assert checkpoint.exists()
    run_hydra(
        [
            "env=service_desk",
            "stage=validate",
            f"ckpt_path={checkpoint}",
            "rollout.eval_instances=4",
            "logger=wandb",
            SMALL_KV_CACHE,
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ]
    )
    (hydra_row,) = val_rows(tmp_path / "hydra")
    # logger=wandb: an offline W&B run (no network, no account) beside the CSV log.
    (wandb_run,) = (tmp_path / "hydra" / "wandb").glob("offline-run-*")
    assert list(wandb_run.glob("run-*.wandb"))  # the run's records, for `wandb sync`
    run_cli(
        ["validate", "--config", "conf/cli/service_desk.yaml", "--ckpt_path", str(checkpoint),
         "--data.rollout.evaluation.eval_instances", "4", "--data.rollout.engine.kv_cache_gib", str(SMALL_KV_CACHE_GIB), "--trainer.default_root_dir", str(tmp_path / "cli"),
         "--trainer.logger.init_args.save_dir", str(tmp_path / "cli")]
    )  # fmt: skip
    (cli_row,) = val_rows(tmp_path / "cli")
    for row in (hydra_row, cli_row):
        assert 0.0 <= row["val/avg@4"] <= row["val/pass@4"] <= 1.0
    # The same checkpoint, instances and sampling seeds: the greedy episodes agree exactly.
    assert hydra_row["val/greedy_success"] == cli_row["val/greedy_success"]
