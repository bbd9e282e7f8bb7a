"""Every committed `lit-asyncrl report` is rebuilt from the run data committed beside it, by the
command the report itself states, and gives the same report.md (all but the time it was made)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from lit_asyncrl.report.main import main as report_main
from lit_asyncrl.report.main import parse_args

ROOT = Path(__file__).parents[1]
REPORT_LINE = re.compile(r"^Report: `(lit-asyncrl report .*)`\.$", re.MULTILINE)
STAMP = re.compile(r"reported \d{4}-\d\d-\d\d \d\d:\d\d UTC")


def committed_reports() -> list[Path]:
    """The reports under docs/results made from data in the repository (their inputs are committed)."""
    found = []
    for report in sorted((ROOT / "docs" / "results").rglob("report.md")):
        command = REPORT_LINE.search(report.read_text())
        if command and all((ROOT / path).exists() for path in parse_args(shlex.split(command.group(1))[2:]).run_dirs):
            found.append(report)
    return found


def test_the_reports_with_committed_data_are_found():
    names = [report.parent.relative_to(ROOT / "docs" / "results").as_posix() for report in committed_reports()]
    assert "table2_regime" in names


@pytest.mark.parametrize("report", committed_reports(), ids=lambda path: path.parent.name)
def test_a_committed_report_is_rebuilt_from_its_committed_runs(report, tmp_path, monkeypatch):
    committed = report.read_text()
    arguments = shlex.split(REPORT_LINE.search(committed).group(1))[2:]
    out_index = arguments.index("--out") + 1
    committed_out = arguments[out_index]
    arguments[out_index] = str(tmp_path / "out")
    monkeypatch.chdir(ROOT)  # the command names paths from the repository's root
    assert report_main(arguments) == 0
    rebuilt = (tmp_path / "out" / "report.md").read_text().replace(str(tmp_path / "out"), committed_out)
    assert str(ROOT) not in rebuilt  # a path of this checkout would differ in a clone elsewhere
    assert STAMP.sub("reported -", rebuilt) == STAMP.sub("reported -", committed)
    assert {path.name for path in (tmp_path / "out").glob("*.png")} <= {
        path.name for path in report.parent.glob("*.png")
    }
