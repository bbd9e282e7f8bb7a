"""The report's PNG figures: curves against step (mean line, band = min..max over seeds) and the
reference fidelity per version gap."""

from __future__ import annotations

from pathlib import Path

from lit_asyncrl.losses.metrics import GAP_BUCKETS
from lit_asyncrl.report.aggregate import fidelity_per_gap, seed_band
from lit_asyncrl.report.runs import Run

#: (metric, title, y label, smoothed): the paper's curves.
CURVES = (
    ("train/task_success", "task success (training episodes)", "fraction of episodes", True),
    ("val/avg@*", "held-out avg@k", "mean success over k samples", False),
    ("train/train_infer_mask", "train-infer mask (r_d kept)", "fraction of policy tokens", True),
    ("train/ppo_clip_ratio", "PPO clip ratio (r_s clipped)", "fraction of policy tokens", True),
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def resolve_key(groups: dict[str, list[Run]], key: str) -> str | None:
    """`val/avg@*` -> the logged name (`val/avg@4`); a plain key if any run logged it."""
    names = {name for runs in groups.values() for run in runs for name in run.series}
    if key.endswith("*"):
        matching = sorted(name for name in names if name.startswith(key[:-1]))
        return matching[0] if matching else None
    return key if key in names else None


def legend_columns(labels: list[str], max_columns: int = 3, characters_across: int = 170) -> int:
    """As many legend columns (up to 3) as the figure's width holds for the longest label: long
    configuration labels (several overrides) get one column each rather than running off the edges."""
    longest = max((len(label) for label in labels), default=1)
    return max(1, min(len(labels), max_columns, characters_across // longest))


def plot_curves(groups: dict[str, list[Run]], png_path: Path, window: int) -> Path:
    plt = _pyplot()
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, (pattern, title, y_label, smoothed) in zip(axes.flat, CURVES):
        key = resolve_key(groups, pattern)
        axis.set_title(f"{title}" + (f", {window}-step moving average" if smoothed and window > 1 else ""), fontsize=10)
        axis.set_xlabel("optimizer step")
        axis.set_ylabel(y_label)
        axis.grid(alpha=0.3)
        if key is None:
            axis.text(0.5, 0.5, f"{pattern} not logged", ha="center", va="center", transform=axis.transAxes)
            continue
        for index, (label, runs) in enumerate(groups.items()):
            steps, mean, low, high = seed_band(runs, key, window if smoothed else 1)
            if not steps:
                continue
            color = colors[index % len(colors)]
            axis.plot(
                steps,
                mean,
                color=color,
                linewidth=1.4,
                marker=None if smoothed else "o",
                markersize=3,
                label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})",
            )
            if len(runs) > 1:
                axis.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    columns = legend_columns(labels)
    if handles:
        figure.legend(handles, labels, loc="lower center", ncol=columns, fontsize=9, frameon=False)
    figure.suptitle("mean over seeds (line) and min..max over seeds (band)", fontsize=10)
    figure.tight_layout(rect=(0, 0.04 + 0.025 * -(-len(labels) // columns), 1, 0.97))
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return png_path


def plot_fidelity(groups: dict[str, list[Run]], png_path: Path) -> Path | None:
    """Mean |log pi_proxy - log pi_old| per version gap and configuration (log scale); None if no
    run measured fidelity."""
    rows = {}
    for label, runs in groups.items():
        values = fidelity_per_gap(runs)
        if any(value is not None for value in values):
            rows[label] = [value[0] if value is not None else 0.0 for value in values]
    if not rows:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(rows)
    for index, (label, values) in enumerate(rows.items()):
        positions = [bucket + index * width for bucket in range(len(GAP_BUCKETS))]
        axis.bar(positions, [max(value, 1e-9) for value in values], width=width, label=label)
    axis.set_yscale("log")
    axis.set_xticks(
        [bucket + 0.4 - width / 2 for bucket in range(len(GAP_BUCKETS))],
        [b.replace("gap_", "gap ") for b in GAP_BUCKETS],
    )
    axis.set_xlabel("version gap of the token (trainer version - sampling version)")
    axis.set_ylabel("mean |log pi_proxy - log pi_old| (nats)")
    axis.set_title("reference fidelity: distance of the proxy each method uses from exact old log-probs", fontsize=10)
    axis.grid(alpha=0.3, axis="y")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return png_path
