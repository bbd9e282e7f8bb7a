"""`lit-asyncrl bounds` prints Proposition 1's effective bounds for n = 1..3."""

import pytest

from lit_asyncrl.cli import main


def test_bounds_command_prints_the_table(capsys):
    # The console script's own function, in-process (a subprocess cost 4 s of imports for this).
    with pytest.raises(SystemExit) as exit_info:
        main(["bounds", "--discrepancy-bounds", "0.997", "1.003", "--clip-bounds", "0.994", "1.006"])
    assert exit_info.value.code in (0, None)
    lines = [
        line.split()
        for line in capsys.readouterr().out.splitlines()
        if line.strip().startswith(("linear", "loglinear"))
    ]
    assert len(lines) == 6  # two interpolations x n = 1, 2, 3
    # log-linear, n = 1 (alpha = 1/2): mask on r^(1/2) in [0.997, 1.003] -> r in [0.997^2, 1.003^2]
    loglinear_n1 = next(line for line in lines if line[0] == "loglinear" and line[1] == "1")
    assert abs(float(loglinear_n1[3]) - 0.997**2) < 1e-6 and abs(float(loglinear_n1[4]) - 1.003**2) < 1e-6
    # linear, n = 1: mask on 1/2 + r/2 in [0.997, 1.003] -> r in [0.994, 1.006]
    linear_n1 = next(line for line in lines if line[0] == "linear" and line[1] == "1")
    assert abs(float(linear_n1[3]) - 0.994) < 1e-6 and abs(float(linear_n1[4]) - 1.006) < 1e-6
