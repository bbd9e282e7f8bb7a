"""`lit-asyncrl report RUN_OR_SWEEP_DIR [...] --out DIR`: curves.png, fidelity.png and report.md.

Runs are grouped by their overrides without the seed (a Hydra multirun's job directories), so a
sweep's part can be reported alone or several parts together; unfinished runs are included with
what they logged and counted in the "finished" column.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import sys
import time
from pathlib import Path

from lit_asyncrl.report.analysis_plan import AnalysisPlan, Endpoint, load_plan
from lit_asyncrl.report.comparisons import comparisons_table, per_seed_scores_table
from lit_asyncrl.report.figures import plot_curves, plot_fidelity
from lit_asyncrl.report.run_data import keep_run_data
from lit_asyncrl.report.runs import group_by_label, load_run
from lit_asyncrl.report.table import COLUMN_NOTES, held_out_keys, per_task_table, results_table, tool_calls_table

#: The metric columns the report reads (prefixes): what `--keep-runs` copies.
REPORT_COLUMNS = (
    "train/task_success",
    "train/train_infer_mask",
    "train/ppo_clip_ratio",
    "train/ref_behavior_logratio_absmean",
    "train/step_s",
    "val/",
    "fidelity/logratio_absmean",
    "fidelity/mask_disagreement",
    "fidelity/version_drift_absmean",
    "fidelity/discrepancy_absmean",
    "train/version_gap_mean",
    "reference/ewma_beta",
    "reference/ewma_resets",
    "rollout/tool_call",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lit-asyncrl report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        help="run directories (each with metrics.csv), or sweep directories holding them",
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for report.md and the PNG figures")
    parser.add_argument("--title", default="lit_asyncrl results", help="the report's heading")
    parser.add_argument("--smooth", type=int, default=10, help="moving-average window (steps) of the training curves")
    parser.add_argument("--runs-command", default=None, help="the command that made the runs, stated in the report")
    parser.add_argument(
        "--keep-runs",
        type=Path,
        default=None,
        help="also copy each run's summary and the columns this report reads here, and report from the copies",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        action="append",
        default=[],
        metavar=("A", "B"),
        help="configurations (labels as in the table) to compare by Welch's t-test over seeds; repeatable",
    )
    parser.add_argument(
        "--baseline", default=None, help="compare every other configuration with this one (as --compare OTHER BASELINE)"
    )
    parser.add_argument(
        "--all-pairs",
        action="store_true",
        help="compare every pair of configurations, in the table's order: one Holm family chosen before any result",
    )
    parser.add_argument(
        "--plan",
        default=None,
        help="the analysis committed with the sweep: a sweep's name (conf/sweep/NAME.yaml) or a YAML file with an "
        "`analysis:` block (its endpoint and its families of comparisons, each family one Holm family)",
    )
    args = parser.parse_args(argv)
    if args.plan is not None and (args.compare or args.baseline or args.all_pairs):
        parser.error("--plan states the comparisons: leave out --compare, --baseline and --all-pairs")
    return args


def asked_pairs(args: argparse.Namespace, groups: dict) -> list[tuple[str, str]]:
    """The pairs of --compare, --baseline and --all-pairs, each once, in that order."""
    pairs = [tuple(pair) for pair in args.compare]
    if args.baseline is not None:
        pairs += [(label, args.baseline) for label in groups if label != args.baseline]
    if args.all_pairs:
        asked = {frozenset(pair) for pair in pairs}
        pairs += [pair for pair in itertools.combinations(groups, 2) if frozenset(pair) not in asked]
    return pairs


def expand_run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories as given, or the run directories inside a sweep directory (e.g. results/findings/table2).

    Files and directories without runs among the paths (a shell glob's `multirun.yaml`, an earlier
    `report/`) are passed over; SystemExit when no run is found at all.
    """
    run_dirs = []
    for path in paths:
        if (path / "metrics.csv").is_file():
            run_dirs.append(path)
        elif path.is_dir():
            run_dirs.extend(sorted(child for child in path.iterdir() if (child / "metrics.csv").is_file()))
    if not run_dirs:
        raise SystemExit("no run directories (with metrics.csv) in or among: " + ", ".join(map(str, paths)))
    return run_dirs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.smooth < 1:
        raise SystemExit(f"--smooth must be >= 1, got {args.smooth}")
    plan = load_plan(args.plan) if args.plan is not None else None
    run_dirs = expand_run_dirs(args.run_dirs)
    if args.keep_runs is not None:
        run_dirs = keep_run_data(run_dirs, args.keep_runs, REPORT_COLUMNS)
    groups = group_by_label([load_run(path) for path in run_dirs])
    for label, runs in groups.items():
        seeds = [run.seed for run in runs]
        if len(set(seeds)) < len(seeds):
            raise SystemExit(
                f"runs of {label!r} share a seed ({', '.join(str(run.path) for run in runs)}): "
                "they come from different sweeps (e.g. quick and table2, whose lengths differ); "
                "report each sweep on its own"
            )
    avg_key, _ = held_out_keys(groups)
    if plan is None:
        plan = AnalysisPlan(Endpoint(), {"": asked_pairs(args, groups)})
    if any(plan.families.values()) and avg_key is None:
        raise SystemExit("--compare/--baseline: the runs logged no held-out score (val/avg@k) to compare")
    try:  # before any figure is drawn: a misspelt label fails at once
        comparisons = {
            family: comparisons_table(groups, pairs, avg_key, plan.endpoint)
            for family, pairs in plan.families.items()
            if pairs
        }
    except ValueError as error:
        raise SystemExit(str(error)) from None
    args.out.mkdir(parents=True, exist_ok=True)
    curves = plot_curves(groups, args.out / "curves.png", args.smooth)
    fidelity = plot_fidelity(groups, args.out / "fidelity.png")
    machines = sorted({run.summary["machine"] for runs in groups.values() for run in runs if run.summary})
    wall_s = sum(run.summary["wall_s"] for runs in groups.values() for run in runs if run.summary)
    report_command = shlex.join(["lit-asyncrl", "report", *map(str, sys.argv[1:] if argv is None else argv)])
    lines = [
        f"# {args.title}",
        "",
        f"{sum(len(runs) for runs in groups.values())} runs in {len(groups)} configurations, reported "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        results_table(groups),
        "",
        COLUMN_NOTES,
        "",
    ]
    if avg_key is not None:
        lines += [
            "Held out, per seed (the runs behind the table's means):",
            "",
            per_seed_scores_table(groups, avg_key, plan.endpoint),
            "",
        ]
    if args.plan is not None:
        lines += [
            f"Analysis committed with the sweep ({plan.source}): the endpoint is {plan.endpoint.describe()} of "
            f"each run; {len(plan.families)} families of comparisons, each adjusted on its own.",
            "",
        ]
    for family, table in comparisons.items():
        lines += [
            f"Comparisons{f' ({family})' if family else ''} (Welch's t-test over seeds, two-sided; the interval "
            "is the 95% one of the difference of means; Holm p: adjusted by Holm's method over this table's "
            f"{len(plan.families[family])} comparisons, each column of p its own family; paired by seed: the "
            "paired t-test over the seeds both ran; the verdict reads the Holm p of Welch's test of the score "
            "at the end):",
            "",
            table,
            "",
        ]
    tasks = per_task_table(groups)
    if tasks is not None:
        lines += ["Held out, per task of the mixture (mean ± spread over seeds, as above):", "", tasks, ""]
    tools = tool_calls_table(groups)
    if tools is not None:
        lines += ["Tool calls (failed calls by reason, as a share of all calls the run made):", "", tools, ""]
    lines += [
        f"![curves]({curves.name})",
    ]
    if fidelity is not None:
        lines += ["", f"![fidelity]({fidelity.name})"]
    lines += [""]
    if args.runs_command:
        lines += [
            f"Runs: `{args.runs_command}`, {wall_s / 60:.0f} minutes of runs in all "
            "(sum of the finished runs' wall times)."
        ]
    lines += [
        f"Report: `{report_command}`.",
        "",
        "Machine: " + ("; ".join(machines) if machines else "not recorded (no finished run)"),
        "",
    ]
    (args.out / "report.md").write_text("\n".join(lines))
    print(args.out / "report.md")
    return 0
