"""The report's markdown table: one row per configuration, mean ± spread over its seeds."""

from __future__ import annotations

from lit_asyncrl.losses.metrics import GAP_BUCKETS
from lit_asyncrl.report.aggregate import (
    fidelity_per_gap,
    final_value,
    first_value,
    lowest_value,
    mean_value,
    median_value,
    per_seed,
    wall_minutes,
)
from lit_asyncrl.report.runs import Run


def _cell(value: tuple[float, float] | None, digits: int = 3, scientific: bool = False) -> str:
    if value is None:
        return "–"
    mean, spread = value
    text = f"{mean:.1e}" if scientific else f"{mean:.{digits}f}"
    if spread:
        text += f" ± {spread:.1e}" if scientific else f" ± {spread:.{digits}f}"
    return text


def held_out_keys(groups: dict[str, list[Run]]) -> tuple[str | None, str | None]:
    names = sorted({name for runs in groups.values() for run in runs for name in run.series})
    avg = next((name for name in names if name.startswith("val/avg@")), None)
    passed = next((name for name in names if name.startswith("val/pass@")), None)
    return avg, passed


def results_table(groups: dict[str, list[Run]]) -> str:
    """Markdown: held-out avg@k and pass@k at the end, lowest train-infer mask, EWMA resets,
    fidelity per version gap, mask disagreement, median step time and wall time."""
    avg_key, pass_key = held_out_keys(groups)
    gap_columns = [bucket.replace("gap_", "gap ") for bucket in GAP_BUCKETS]
    header = [
        "configuration",
        "seeds (finished)",
        f"held-out {avg_key.split('/')[1] if avg_key else 'avg@k'} at start",
        f"held-out {avg_key.split('/')[1] if avg_key else 'avg@k'} at end",
        f"held-out {pass_key.split('/')[1] if pass_key else 'pass@k'} at end",
        "lowest train-infer mask",
        "mean abs log(pi_ref/mu)",
        "version gap (mean)",
        "EWMA beta (end)",
        "EWMA resets",
        *[f"fidelity {column}" for column in gap_columns],
        "mask disagreement",
        "drift per version",
        "discrepancy",
        "step s (median)",
        "wall min",
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, members in groups.items():
        # Statistics over the finished runs when there are any: a run cut short has no "end".
        finished = [run for run in members if run.summary is not None]
        runs = finished or members
        cells = [
            label,
            f"{len(members)} ({len(finished)})",
            _cell(per_seed(runs, first_value(avg_key))) if avg_key else "–",
            _cell(per_seed(runs, final_value(avg_key))) if avg_key else "–",
            _cell(per_seed(runs, final_value(pass_key))) if pass_key else "–",
            _cell(per_seed(runs, lowest_value("train/train_infer_mask"))),
            _cell(per_seed(runs, mean_value("train/ref_behavior_logratio_absmean")), scientific=True),
            _cell(per_seed(runs, mean_value("train/version_gap_mean")), digits=2),
            _cell(per_seed(runs, final_value("reference/ewma_beta")), digits=2),
            _cell(per_seed(runs, final_value("reference/ewma_resets")), digits=1),
            *[_cell(value, scientific=True) for value in fidelity_per_gap(runs)],
            _cell(per_seed(runs, mean_value("fidelity/mask_disagreement")), digits=4),
            _cell(per_seed(runs, mean_value("fidelity/version_drift_absmean")), scientific=True),
            _cell(per_seed(runs, mean_value("fidelity/discrepancy_absmean")), scientific=True),
            _cell(per_seed(runs, median_value("train/step_s")), digits=2),
            _cell(per_seed(runs, wall_minutes), digits=1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_task_table(groups: dict[str, list[Run]]) -> str | None:
    """Markdown for runs on a mixture of tasks: per task, held-out avg@k at start and end and pass@k
    at end (the paper's layout, a column pair per domain); None when no run logged a task's metrics."""
    names = sorted({name for runs in groups.values() for run in runs for name in run.series})
    avg_keys = [name for name in names if name.count("/") == 2 and name.startswith("val/") and "/avg@" in name]
    if not avg_keys:
        return None
    tasks = [(key.split("/")[1], key, key.replace("/avg@", "/pass@")) for key in avg_keys]
    k = avg_keys[0].rsplit("@", 1)[1]
    header = [
        "configuration",
        *(column for task, _, _ in tasks for column in (f"{task} avg@{k} start -> end", f"{task} pass@{k} end")),
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, members in groups.items():
        runs = [run for run in members if run.summary is not None] or members
        cells = [label]
        for _, avg_key, pass_key in tasks:
            start = per_seed(runs, first_value(avg_key))
            end = per_seed(runs, final_value(avg_key))
            cells += [f"{_cell(start)} -> {_cell(end)}", _cell(per_seed(runs, final_value(pass_key)))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


COLUMN_NOTES = """Columns: mean ± sample standard deviation over seeds (no ± with one seed), over the finished
runs when a configuration has any. *held-out* values
are the first (after the warm start, before any RL step) and the last evaluation of each run, on
instances never trained on. *lowest train-infer mask* is the
smallest fraction of policy tokens the r_d mask kept in any step. *mean abs log(pi_ref/mu)* is
the mean over steps of |log r_d| as the loss saw it: with an exact reference, the training-inference
discrepancy alone (the bf16 engine against the fp32 trainer); with a proxy, staleness too (– where
the loss takes no reference). *version gap* is the mean over steps of the
trained tokens' mean version gap (how stale the batches were). *EWMA beta* is the EWMA reference's
decay at the last step (W/(W+2) unless fixed) and *EWMA resets* counts its automatic resets (– for
other references). *fidelity gap n* is the mean over steps of
|log pi_proxy - log pi_old| (nats) on the tokens n versions old, pi_proxy being what the method puts
in pi_old's place and pi_old exact (shadow snapshots); *mask disagreement* is the fraction of policy
tokens whose r_d mask decision differs from the one exact pi_old gives. *drift per version* is the
mean over steps of |log pi_v - log pi_(v-1)| on the batch's tokens (how far one version moves the
policy) and *discrepancy* of |log pi_old - log mu_old| (the train-inference discrepancy, pi_old
exact): their ratio is the run's regime (– for runs without the shadow, or made before it logged
them, 2026-12-06). *step s* is the wall time of
an optimizer step (waiting for rollouts, reference, update, weight push), *wall min* the whole run."""


def tool_calls_table(groups: dict[str, list[Run]]) -> str | None:
    """Markdown for runs on a tool task: calls per episode at the end, and the run's failed calls by
    reason as a share of all its calls (mean ± spread over seeds); None when no run called tools."""
    names = sorted({name for runs in groups.values() for run in runs for name in run.series})
    if "rollout/tool_calls_per_episode" not in names:
        return None
    tools = [name for name in names if name.startswith("rollout/tool_calls/")]
    reasons = [name for name in names if name.startswith("rollout/tool_call_errors/")]

    def share(reason: str):
        def of(run: Run) -> float | None:
            # A call of a known tool is counted under its tool even when it failed; a turn the parser
            # could not read and a call of an unknown tool are counted only as errors.
            calls = sum(run.last(name) or 0.0 for name in tools) + sum(
                run.last(name) or 0.0 for name in reasons if name.endswith(("unparsable", "unknown_tool"))
            )
            failed = run.last(reason)
            return None if failed is None or calls == 0 else failed / calls

        return of

    header = [
        "configuration",
        "tool calls per episode (end)",
        *(f"{name.rsplit('/', 1)[1]} per call" for name in reasons),
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, members in groups.items():
        runs = [run for run in members if run.summary is not None] or members
        cells = [label, _cell(per_seed(runs, final_value("rollout/tool_calls_per_episode")), 2)]
        cells += [_cell(per_seed(runs, share(reason))) for reason in reasons]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
