"""`python -m lit_asyncrl.report.regime_map RUN_OR_SWEEP_DIR [...] --out DIR`: the regime map.

Each run (made with `fidelity_proxies`, e.g. `+sweep=regime_map`) is placed by the ratio of its
drift per version (`fidelity/version_drift_absmean`) to its train-inference discrepancy
(`fidelity/discrepancy_absmean`), both averaged over its steps; for each proxy the map gives the
mean distance from exact pi_old (`fidelity/<proxy>/logratio_absmean`) and how often the r_d mask
decides otherwise with it. A proxy whose distance exceeds the mask's half-width (log 1.01 for the
paper's [0.99, 1.01]) moves tokens across the mask by itself: past that drift it stops being usable.
Writes report.md (tables, crossings), regime_map.png and regime_map.csv (one row per run).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from lit_asyncrl.losses.metrics import GAP_BUCKETS
from lit_asyncrl.report.main import expand_run_dirs
from lit_asyncrl.report.run_data import keep_run_data
from lit_asyncrl.report.runs import Run, load_run

#: The usual proxies in the order the figure and the tables show them (others follow by name).
PROXY_ORDER = ("async_recompute", "linear_prox", "loglinear_prox", "ewma", "ewma_0.75", "ewma_0.9")
GAPS = GAP_BUCKETS


@dataclass
class MapPoint:
    """One run on the map: its learning rate, drift, discrepancy and each proxy's distances."""

    name: str
    lr: float
    seed: int
    drift: float
    discrepancy: float
    exact: float  # the control's own distance (the exact route: 0 up to float rounding)
    distance: dict[str, float]  # proxy -> mean |log pi_proxy - log pi_old| over the steps
    distance_by_gap: dict[str, dict[str, float]]  # proxy -> gap bucket -> mean over the steps that had it
    disagreement: dict[str, float]  # proxy -> mean mask disagreement

    @property
    def ratio(self) -> float:
        return self.drift / self.discrepancy


def _mean(run: Run, key: str, skip: int) -> float:
    values = [value for step, value in run.series.get(key, []) if step >= skip and math.isfinite(value)]
    return statistics.fmean(values) if values else math.nan


def map_point(run: Run, skip: int) -> MapPoint:
    """A run's place on the map, from its steps >= `skip` (the first steps fill the version window)."""
    proxies = proxy_names(run.series)
    if not proxies or "fidelity/version_drift_absmean" not in run.series:
        raise SystemExit(f"{run.path} has no fidelity_proxies metrics: make it with +sweep=regime_map")
    rates = [item.split("=", 1)[1] for item in (run.summary or {}).get("overrides", []) if item.startswith("model.lr=")]
    if not rates:
        raise SystemExit(
            f"{run.path} has no model.lr override in its summary.json: the map places runs by learning rate"
        )
    lr = float(rates[0])
    return MapPoint(
        name=run.path.name,
        lr=lr,
        seed=run.seed,
        drift=_mean(run, "fidelity/version_drift_absmean", skip),
        discrepancy=_mean(run, "fidelity/discrepancy_absmean", skip),
        exact=_mean(run, "fidelity/logratio_absmean", skip),
        distance={name: _mean(run, f"fidelity/{name}/logratio_absmean", skip) for name in proxies},
        distance_by_gap={
            name: {gap: _mean(run, f"fidelity/{name}/logratio_absmean/{gap}", skip) for gap in GAPS} for name in proxies
        },
        disagreement={name: _mean(run, f"fidelity/{name}/mask_disagreement", skip) for name in proxies},
    )


def proxy_names(series: dict) -> list[str]:
    """The proxies a run measured (`fidelity/<proxy>/logratio_absmean`), the usual ones first."""
    found = {
        key.split("/")[1]
        for key in series
        if key.count("/") == 2 and key.startswith("fidelity/") and key.endswith("/logratio_absmean")
    }
    return [name for name in PROXY_ORDER if name in found] + sorted(found - set(PROXY_ORDER))


def mean_by_lr(points: list[MapPoint]) -> list[MapPoint]:
    """One point per learning rate: each quantity averaged over its seeds (the crossings and the
    figure's lines are drawn through these)."""
    by_lr: dict[float, list[MapPoint]] = {}
    for point in points:
        by_lr.setdefault(point.lr, []).append(point)

    def fmean(values) -> float:
        finite = [value for value in values if not math.isnan(value)]
        return statistics.fmean(finite) if finite else math.nan

    means = []
    for lr, runs in sorted(by_lr.items()):
        proxies = list(runs[0].distance)
        means.append(
            MapPoint(
                name=f"lr={lr:g} ({len(runs)} seeds)",
                lr=lr,
                seed=-1,
                drift=fmean(run.drift for run in runs),
                discrepancy=fmean(run.discrepancy for run in runs),
                exact=fmean(run.exact for run in runs),
                distance={name: fmean(run.distance[name] for run in runs) for name in proxies},
                distance_by_gap={
                    name: {gap: fmean(run.distance_by_gap[name][gap] for run in runs) for gap in GAPS}
                    for name in proxies
                },
                disagreement={name: fmean(run.disagreement[name] for run in runs) for name in proxies},
            )
        )
    return means


def closest_counts(points: list[MapPoint]) -> dict[str, int]:
    """In how many runs each proxy was the closest to pi_old."""
    counts = dict.fromkeys(points[0].distance, 0)
    for point in points:
        counts[min(point.distance, key=point.distance.get)] += 1
    return counts


def crossing(points: list[MapPoint], proxy: str, half_width: float) -> str:
    """Where the proxy's distance crosses `half_width`, interpolated in log-log between the runs
    around it: the ratio of a single rise through it, each crossing named when there are others,
    or that it stays below or above."""
    values = [(point.ratio, point.distance[proxy]) for point in sorted(points, key=lambda point: point.ratio)]
    crossings = []
    for (x0, y0), (x1, y1) in zip(values, values[1:]):
        if (y0 <= half_width) != (y1 <= half_width):
            share = (math.log(half_width) - math.log(y0)) / (math.log(y1) - math.log(y0))
            at = math.exp(math.log(x0) + share * (math.log(x1) - math.log(x0)))
            crossings.append((at, "rises through" if y1 > half_width else "falls back below"))
    if not crossings:
        side = "below" if values[0][1] <= half_width else "above"
        return f"{side} at every ratio measured ({values[0][0]:.2g} to {values[-1][0]:.2g})"
    if len(crossings) == 1 and crossings[0][1] == "rises through":
        return f"{crossings[0][0]:.2g}"
    return ", ".join(f"{how} at {at:.2g}" for at, how in crossings)


def report_markdown(points: list[MapPoint], half_width: float, command: str | None) -> str:
    points = sorted(points, key=lambda point: (point.ratio, point.seed))
    proxies = list(points[0].distance)
    lines = ["# Regime map: where each proxy for pi_old stops tracking it", ""]
    if command:
        lines += [f"Made by `{command}`.", ""]
    lines += [
        f"Mask half-width: {half_width:.4g} nats. Per run: the means over its steps of the drift per version "
        "|log pi_v - log pi_(v-1)|, the discrepancy |log pi_old - log mu_old|, and each proxy's distance "
        "|log pi_proxy - log pi_old| (mask disagreement in brackets); the exact route trains (control).",
        "",
        "| run | lr | seed | drift | discrepancy | drift / discrepancy | exact | " + " | ".join(proxies) + " |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(proxies),
    ]
    for point in points:
        cells = [f"{point.distance[name]:.2e} ({point.disagreement[name]:.3f})" for name in proxies]
        lines.append(
            f"| {point.name} | {point.lr:g} | {point.seed} | {point.drift:.2e} | {point.discrepancy:.2e} | "
            f"{point.ratio:.3g} | {point.exact:.1e} | " + " | ".join(cells) + " |"
        )
    # gaps no run had tokens of after its first steps (e.g. a window always full) get no column
    gaps = [
        gap
        for gap in GAPS
        if any(not math.isnan(point.distance_by_gap[name][gap]) for point in points for name in proxies)
    ]
    lines += ["", "Distance per version gap (mean over the steps with tokens of that gap):", ""]
    lines += ["| run | drift / discrepancy | " + " | ".join(f"{name} {gap}" for name in proxies for gap in gaps) + " |"]
    lines += ["|---|---:|" + "---:|" * (len(proxies) * len(gaps))]
    for point in points:
        cells = [_fmt(point.distance_by_gap[name][gap]) for name in proxies for gap in gaps]
        lines.append(f"| {point.name} | {point.ratio:.3g} | " + " | ".join(cells) + " |")
    means = mean_by_lr(points)
    lines += [
        "",
        "Where each proxy's distance (mean over the seeds of a learning rate) crosses the mask's half-width,",
        "",
    ]
    lines += ["| proxy | crosses at drift / discrepancy | closest to pi_old in |", "|---|---|---|"]
    closest = closest_counts(points)
    lines += [
        f"| {name} | {crossing(means, name, half_width)} | {closest[name]} of {len(points)} runs |" for name in proxies
    ]
    return "\n".join(lines) + "\n"


def _fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2e}"


def plot_map(points: list[MapPoint], half_width: float, png_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = sorted(mean_by_lr(points), key=lambda point: point.ratio)
    figure, axis = plt.subplots(figsize=(7.5, 5))
    for name in means[0].distance:
        label = "ewma (beta = W/(W+2))" if name == "ewma" else name
        (line,) = axis.plot([p.ratio for p in means], [p.distance[name] for p in means], marker="o", label=label)
        if len(points) > len(means):  # several seeds: each run as a small mark of its proxy's colour
            axis.scatter(
                [p.ratio for p in points], [p.distance[name] for p in points], s=10, color=line.get_color(), alpha=0.6
            )
    axis.plot(
        [p.ratio for p in means],
        [p.discrepancy for p in means],
        color="grey",
        linestyle=":",
        label="discrepancy |pi_old - mu|",
    )
    axis.axhline(half_width, color="black", linestyle="--", linewidth=1, label=f"mask half-width ({half_width:.3g})")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("drift per version / train-inference discrepancy")
    axis.set_ylabel("mean |log pi_proxy - log pi_old| (nats)")
    axis.set_title("regime map: distance of each proxy from exact pi_old", fontsize=10)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return png_path


def write_csv(points: list[MapPoint], path: Path) -> None:
    proxies = list(points[0].distance)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "run",
                "lr",
                "seed",
                "drift",
                "discrepancy",
                "ratio",
                "exact",
                *(f"{n}_distance" for n in proxies),
                *(f"{n}_disagreement" for n in proxies),
            ]
        )
        for p in sorted(points, key=lambda point: (point.ratio, point.seed)):
            writer.writerow(
                [
                    p.name,
                    p.lr,
                    p.seed,
                    p.drift,
                    p.discrepancy,
                    p.ratio,
                    p.exact,
                    *(p.distance[n] for n in proxies),
                    *(p.disagreement[n] for n in proxies),
                ]
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lit_asyncrl.report.regime_map", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, help="run directories of +sweep=regime_map, or sweep directories holding them"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="directory for report.md, regime_map.png and regime_map.csv"
    )
    parser.add_argument(
        "--mask-high", type=float, default=1.01, help="upper r_d mask bound the runs used; half-width = log(high)"
    )
    parser.add_argument("--skip", type=int, default=3, help="steps left out at the start (the version window fills)")
    parser.add_argument("--command", default=None, help="the command that made the runs, stated in the report")
    parser.add_argument(
        "--keep-runs", type=Path, default=None, help="also copy each run's summary and fidelity columns here"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run_dirs = expand_run_dirs(args.run_dirs)
    if args.keep_runs is not None:
        # the map is then made from the copies; the mask and gap columns back what the findings say of them
        run_dirs = keep_run_data(
            run_dirs, args.keep_runs, ["fidelity/", "train/train_infer_mask", "train/version_gap_mean"]
        )
    points = [map_point(load_run(path), args.skip) for path in run_dirs]
    half_width = math.log(args.mask_high)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(report_markdown(points, half_width, args.command))
    write_csv(points, args.out / "regime_map.csv")
    plot_map(points, half_width, args.out / "regime_map.png")
    print(args.out / "report.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
