"""What an exact reference route promises in a real run, checked in its run dir's metrics."""

from tests.support.runs import read_all_rows, read_rows


def check_exact_route(run_dir) -> list[dict[str, float]]:
    """Check what every exact route promises in its sweep job's run dir; returns the metric rows.

    pi_old of each token's own version equals the fp32 engine's mu: r_d == 1 up to noise, whatever
    the version gap (an off-by-one version would show gaps of ~1e-2 or more), and every policy token
    has its pi_old.
    With `fidelity=true` the shadow snapshots score the same tokens independently: an exact route
    agrees with them within 1e-5 at every gap, and masks exactly as they do.
    """
    rows = read_rows(run_dir / "metrics.csv")
    assert len(rows) == 8
    assert max(row["train/version_gap_max"] for row in rows) >= 1  # stale tokens were trained on
    for row in rows:
        assert row["train/nonfinite_tokens"] == 0
        assert row["train/ref_behavior_logratio_absmax"] < 1e-4
        assert row["train/train_infer_mask"] == 1.0
        assert row["fidelity/logratio_absmax"] <= 1e-5
        assert row["fidelity/mask_disagreement"] == 0.0
    gap_rows = read_all_rows(run_dir / "metrics.csv")
    stale_buckets = {
        key
        for row in gap_rows
        for key in row
        if key.startswith("fidelity/logratio_absmax/gap_") and key != "fidelity/logratio_absmax/gap_0"
    }
    assert stale_buckets  # the shadow measured stale tokens too
    assert max(row.get(key, 0.0) for row in gap_rows for key in stale_buckets) <= 1e-5
    return rows


def check_interrupt_sync(run_dir) -> None:
    rows = check_exact_route(run_dir)
    assert all(row["interrupt_sync/stall_s"] > 0 for row in rows)
    assert sum(row["interrupt_sync/scored_tokens"] for row in rows) > 0


def check_dedicated(run_dir) -> None:
    rows = check_exact_route(run_dir)
    assert rows[-1]["dedicated/scored_tokens"] >= rows[-1]["rollout/trained"]  # at least one token per episode
