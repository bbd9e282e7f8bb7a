"""Reference sources in real runs (exact routes, async recompute, PPO-EWMA, an MoE under routing replay), through
the Hydra entry."""

import pytest

from tests.support.reference_checks import check_dedicated, check_exact_route, check_interrupt_sync
from tests.support.runs import STALE_RUN, read_rows, run_hydra

pytestmark = pytest.mark.engine


#: The sweep's jobs, in order: the three exact routes, async recompute, PPO-EWMA, and snapshots of a
#: mixture of experts under the engine's routing.
SWEPT_EXPERIMENTS = ["snapshot", "interrupt_sync", "dedicated", "decoupled_async", "ppo_ewma", "moe_routing_replay"]


def run_reference_sweep(sweep_dir) -> tuple[dict[str, object], str]:
    """One Hydra multirun over `SWEPT_EXPERIMENTS` (one process, its jobs one after another, so a
    route costs its engine and its steps, not a process start): ({experiment: job dir}, console).
    Weights go by the staged route: its exactness in real runs (mu equal to the trainer's log-probs
    at each token's version, whatever the gap) is checked here; the other run tests use the file route."""
    sweep = ["-m", f"experiment={','.join(SWEPT_EXPERIMENTS)}", f"hydra.sweep.dir={sweep_dir}", "fidelity=true"]
    result = run_hydra([*sweep, "rollout.weight_transfer=staged", *STALE_RUN], timeout_s=900)
    # Each job's dir is named by its number and overrides (`hydra.sweep.subdir`).
    job_dirs = {
        experiment: next(sweep_dir.glob(f"{job}_experiment={experiment},*"))
        for job, experiment in enumerate(SWEPT_EXPERIMENTS)
    }
    return job_dirs, result.stdout + result.stderr


def test_each_reference_route_keeps_its_promise_in_one_sweep(tmp_path, subtests):
    # One subtest per route, each reported on its own.
    job_dirs, console = run_reference_sweep(tmp_path)
    with subtests.test("snapshot gives exact old log-probs at every gap"):
        check_snapshot(job_dirs["snapshot"])
    with subtests.test("interrupt-sync gives exact old log-probs"):
        check_interrupt_sync(job_dirs["interrupt_sync"])
    with subtests.test("the dedicated old-logit model gives exact old log-probs"):
        check_dedicated(job_dirs["dedicated"])
    with subtests.test("async recompute absorbs staleness into r_d"):
        check_async_recompute(job_dirs["decoupled_async"], console)
    with subtests.test("PPO-EWMA starts from the warmed-up weights and logs its state"):
        check_ppo_ewma(job_dirs["ppo_ewma"])
    with subtests.test("an MoE's snapshots stay exact, each under the routing its version used"):
        check_routing_replay(job_dirs["moe_routing_replay"])


def check_snapshot(run_dir) -> None:
    rows = check_exact_route(run_dir)
    for row in rows:
        assert 1 <= row["snapshot/version_shards_per_batch"] <= 4
        assert row["snapshot/resident"] <= 5  # max_version_gap + 1 plus the newest version
    assert any(row["snapshot/historical_shards_per_batch"] >= 1 for row in rows)


def check_routing_replay(run_dir) -> None:
    # Each snapshot's pi_old takes the experts the engine chose under that snapshot's version: with an fp32
    # engine pi_old is then mu itself at every gap, so a routing of another version (or replayed at the wrong
    # positions, or of another request) would break the exact route's checks.
    rows = check_exact_route(run_dir)
    assert all(0 <= row["train/routing_flipped"] <= 1 for row in rows)


def check_async_recompute(run_dir, console: str) -> None:
    assert "r_s == 1 for every token with a version gap > 0" in console  # the guard warned
    rows = read_rows(run_dir / "metrics.csv")
    stale = [row for row in rows if row["train/version_gap_max"] >= 1]
    assert stale
    # The current weights are not the sampling weights of stale tokens: r_d moves away from 1.
    assert max(row["train/ref_behavior_logratio_absmax"] for row in stale) > 1e-3


def check_ppo_ewma(run_dir) -> None:
    rows = read_rows(run_dir / "metrics.csv")
    assert len(rows) == 8
    # Step 0: the average holds only the weights the RL fit starts with, which sampled every token
    # (gap 0, fp32 engine), so pi_ewma == mu. Had it started before the warm start, it would be the
    # random initialisation and differ by far more.
    assert rows[0]["train/version_gap_max"] == 0
    assert rows[0]["train/ref_behavior_logratio_absmax"] < 1e-4
    # Later the average mixes versions, so it is no longer the sampling policy of stale tokens.
    assert max(row["train/ref_behavior_logratio_absmax"] for row in rows[1:]) > 1e-4
    # Fidelity: at step 0 the average is version 0 itself (exact); once tokens are stale, beta > 0
    # keeps older weights than the token's own version and the shadow sees it.
    assert rows[0]["fidelity/logratio_absmax"] <= 1e-5
    stale = [row for row in rows if row["train/version_gap_max"] >= 1]
    assert stale and max(row["fidelity/logratio_absmean"] for row in stale) > 1e-3
    window = 0.0  # the paper's decay: beta = W/(W+2), W the largest version gap seen so far
    for row in rows:
        window = max(window, row["train/version_gap_max"])
        assert row["reference/ewma_beta"] == pytest.approx(window / (window + 2))
        assert 0 <= row["reference/low_mask_streak"] <= 3 and row["reference/low_mask_streak"].is_integer()
        assert row["reference/ewma_resets"].is_integer()
    resets = [row["reference/ewma_resets"] for row in rows]
    assert resets == sorted(resets)  # a running count
