"""``lit-asyncrl bounds``: print the effective bounds of Proposition 1 for version gaps 1..3 (Table 4)."""

from __future__ import annotations

import argparse

from lit_asyncrl.losses.bounds import effective_bounds

# The thresholds of the paper's experiments (Table 4, first block): discrepancy mask [0.99, 1.01],
# PPO clip [0.997, 1.004]. 1.003 / 1.006 is one run of the Sec. 6.4 threshold ablation (snap1003_1006).
DEFAULT_DISCREPANCY_BOUNDS = (0.99, 1.01)
DEFAULT_CLIP_BOUNDS = (0.997, 1.004)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lit-asyncrl bounds",
        description="Bounds on r = pi_theta/mu_old induced by linear and log-linear interpolation, alpha = 1/(n+1).",
    )
    parser.add_argument("--discrepancy-bounds", nargs=2, type=float, metavar=("LOW", "HIGH"),
                        default=DEFAULT_DISCREPANCY_BOUNDS, help="r_d mask bounds (default: %(default)s)")  # fmt: skip
    parser.add_argument("--clip-bounds", nargs=2, type=float, metavar=("LOW", "HIGH"),
                        default=DEFAULT_CLIP_BOUNDS, help="r_s clip bounds (default: %(default)s)")  # fmt: skip
    parser.add_argument("--max-gap", type=int, default=3, help="largest version gap n (default: %(default)s)")
    return parser


def format_table(discrepancy_bounds: tuple[float, float], clip_bounds: tuple[float, float], max_gap: int) -> str:
    """The table as text: one row per interpolation and version gap ``n = 1..max_gap``."""
    header = ("interpolation", "n", "alpha", "mask_low", "mask_high", "clip_low(A<0)", "clip_high(A>=0)")
    rows = [header]
    for interpolation in ("linear", "loglinear"):
        for gap in range(1, max_gap + 1):
            b = effective_bounds(interpolation, discrepancy_bounds=discrepancy_bounds,
                                 clip_bounds=clip_bounds, version_gap=gap)  # fmt: skip
            numbers = (b.alpha, b.mask_low, b.mask_high, b.clip_low, b.clip_high)
            rows.append((interpolation, str(gap), *(f"{x:.6f}" for x in numbers)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and print the table; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.max_gap < 1:
        parser.error("--max-gap must be >= 1")
    try:
        table = format_table(tuple(args.discrepancy_bounds), tuple(args.clip_bounds), args.max_gap)
    except ValueError as error:
        parser.error(str(error))
    print(f"discrepancy_bounds={tuple(args.discrepancy_bounds)}  clip_bounds={tuple(args.clip_bounds)}")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
