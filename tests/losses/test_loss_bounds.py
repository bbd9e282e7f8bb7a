"""effective_bounds (Proposition 1) in closed form, and against the strategies' actual gradients."""

import math
from pathlib import Path

import pytest

from lit_asyncrl.losses import effective_bounds
from lit_asyncrl.losses.bounds_table import main
from tests.support.losses import inputs_from_ratios, run

DISCREPANCY = (0.81, 1.21)
CLIP = (0.8, 1.2)


def test_loglinear_closed_form_gap_1():
    # alpha = 1/2: mask r in [0.81^2, 1.21^2], clip r in [0.8^2, 1.2^2]
    b = effective_bounds("loglinear", discrepancy_bounds=DISCREPANCY, clip_bounds=CLIP, version_gap=1)
    assert (b.alpha, b.mask_low, b.mask_high) == pytest.approx((0.5, 0.6561, 1.4641), abs=1e-12)
    assert (b.clip_low, b.clip_high) == pytest.approx((0.64, 1.44), abs=1e-12)


def test_linear_closed_form_gap_1():
    # alpha = 1/2: r_d = (1 + r)/2 -> mask [0.62, 1.42]; r_s = 2r/(1+r) -> clip [2/3, 1.5]
    b = effective_bounds("linear", discrepancy_bounds=DISCREPANCY, clip_bounds=CLIP, version_gap=1)
    assert (b.mask_low, b.mask_high) == pytest.approx((0.62, 1.42), abs=1e-12)
    assert (b.clip_low, b.clip_high) == pytest.approx((2 / 3, 1.5), abs=1e-12)
    assert b.gradient_window(+1) == pytest.approx((0.62, 1.42))
    assert b.gradient_window(-1) == pytest.approx((2 / 3, 1.42))


def test_linear_unbounded_sides():
    # low_d <= alpha: r_d >= alpha always -> no lower mask bound; high_c >= 1/(1-alpha): no upper clip
    b = effective_bounds("linear", discrepancy_bounds=(0.4, 1.5), clip_bounds=(0.8, 2.5), version_gap=1)
    assert b.mask_low == 0.0
    assert b.clip_high == math.inf


def test_gap_zero_is_plain_ppo_on_r():
    b = effective_bounds("loglinear", discrepancy_bounds=DISCREPANCY, clip_bounds=CLIP, version_gap=0)
    assert (b.mask_low, b.mask_high, b.clip_low, b.clip_high) == (0.0, math.inf, 0.8, 1.2)


def test_argument_errors():
    with pytest.raises(ValueError, match="exactly one"):
        effective_bounds("linear", discrepancy_bounds=DISCREPANCY, clip_bounds=CLIP)
    with pytest.raises(ValueError, match="interpolation"):
        effective_bounds("cubic", discrepancy_bounds=DISCREPANCY, clip_bounds=CLIP, version_gap=1)
    with pytest.raises(ValueError, match="clip_bounds"):
        effective_bounds("linear", discrepancy_bounds=DISCREPANCY, clip_bounds=(1.2, 0.8), version_gap=1)


def passes_gradient(name: str, total_ratio: float, advantage: float, gap: int) -> bool:
    inputs = inputs_from_ratios([total_ratio], [advantage], version_gap=[gap])
    kwargs = {"clip_bounds": CLIP}
    if name.endswith("train_infer"):
        kwargs["discrepancy_bounds"] = DISCREPANCY
    _, grad = run(name, inputs, **kwargs)
    return bool(grad[0, 0] != 0)


def boundary(name: str, advantage: float, gap: int, inside: float, outside: float) -> float:
    """Bisection in log r between a ratio that passes gradient and one that does not."""
    assert passes_gradient(name, inside, advantage, gap) and not passes_gradient(name, outside, advantage, gap)
    lo, hi = math.log(inside), math.log(outside)
    for _ in range(45):  # log-width 8.5 / 2^45 ~ 2e-13
        mid = (lo + hi) / 2
        if passes_gradient(name, math.exp(mid), advantage, gap):
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


@pytest.mark.parametrize("gap", [1, 2, 3])
@pytest.mark.parametrize("interpolation", ["linear", "loglinear"])
def test_empirical_boundaries_equal_effective_bounds(interpolation, gap):
    b = effective_bounds(interpolation, discrepancy_bounds=DISCREPANCY, clip_bounds=CLIP, version_gap=gap)
    plain, masked = f"{interpolation}_prox", f"{interpolation}_prox_train_infer"
    # clip alone (no mask): A >= 0 stops above clip_high, A < 0 stops below clip_low
    assert boundary(plain, +1.0, gap, inside=1.0, outside=50.0) == pytest.approx(b.clip_high, abs=1e-6)
    assert boundary(plain, -1.0, gap, inside=1.0, outside=0.01) == pytest.approx(b.clip_low, abs=1e-6)
    # mask: A >= 0 has no lower clip, so it stops at mask_low; A < 0 has no upper clip: mask_high
    assert boundary(masked, +1.0, gap, inside=1.0, outside=0.01) == pytest.approx(b.mask_low, abs=1e-6)
    assert boundary(masked, -1.0, gap, inside=1.0, outside=50.0) == pytest.approx(b.mask_high, abs=1e-6)
    # both together: the window of each advantage sign
    positive_high = min(b.mask_high, b.clip_high)
    negative_low = max(b.mask_low, b.clip_low)
    assert boundary(masked, +1.0, gap, inside=1.0, outside=50.0) == pytest.approx(positive_high, abs=1e-6)
    assert boundary(masked, -1.0, gap, inside=1.0, outside=0.01) == pytest.approx(negative_low, abs=1e-6)


def test_bounds_table_prints_gaps_1_to_3(capsys):
    assert main(["--discrepancy-bounds", "0.81", "1.21", "--clip-bounds", "0.8", "1.2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.split()[:1] in (["linear"], ["loglinear"])]
    assert [(row[0], row[1]) for row in rows] == [(i, str(n)) for i in ("linear", "loglinear") for n in (1, 2, 3)]
    assert [float(x) for x in rows[3][2:]] == pytest.approx([0.5, 0.6561, 1.4641, 0.64, 1.44], abs=1e-6)


def test_bounds_table_rejects_invalid_bounds(capsys):
    with pytest.raises(SystemExit) as error:
        main(["--clip-bounds", "1.2", "0.8"])
    assert error.value.code == 2
    assert "clip_bounds" in capsys.readouterr().err


def test_bounds_table_defaults_are_the_thresholds_of_the_papers_experiments(capsys):
    # Table 4's first block (the experiments' setting): discrepancy mask [0.99, 1.01], clip [0.997, 1.004].
    # 1.003 / 1.006 is one run of the Sec. 6.4 ablation (snap1003_1006), not the default.
    assert main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "discrepancy_bounds=(0.99, 1.01)  clip_bounds=(0.997, 1.004)"
    # log-linear, n = 1 (alpha = 1/2): mask 0.99^2, 1.01^2; clip 0.997^2, 1.004^2
    loglinear_n1 = next(line.split() for line in lines if line.split()[:2] == ["loglinear", "1"])
    assert [float(x) for x in loglinear_n1[2:]] == pytest.approx([0.5, 0.9801, 1.0201, 0.994009, 1.008016], abs=1e-6)


def test_docs_bounds_table_is_the_commands_output(capsys):
    # docs/losses.md shows `python -m lit_asyncrl.losses.bounds_table ...` and its output verbatim.
    docs = (Path(__file__).resolve().parents[2] / "docs" / "losses.md").read_text()
    block = docs.split("$ python -m lit_asyncrl.losses.bounds_table", 1)[1].split("```", 1)[0].splitlines()
    assert main(block[0].split()) == 0
    assert capsys.readouterr().out.splitlines() == block[1:]
