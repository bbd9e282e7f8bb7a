"""A few training steps against an MCP server's tools on the real engine: the server counts the calls
it served, and the run leaves nothing behind (no server, no file)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.runs import read_rows
from tests.integration.test_cleanup import FAILING_FROM_INSIDE, STOPPED_FROM_OUTSIDE, Run, _cmdline

# Compares listings, as the cleanup tests do, and runs in their groups.
pytestmark = pytest.mark.engine


def mcp_run(tmp_path: Path, overrides: list[str]) -> tuple[Run, Path]:
    """A Hydra run of the MCP addition task (`mcp_task.py`), once its server is up; and the server's count file."""
    count_file, config_dir = tmp_path / "served", tmp_path / "conf" / "env"
    config_dir.mkdir(parents=True)
    (config_dir / "mcp_addition.yaml").write_text(
        f"_target_: tests.integration.mcp_task.McpAdditionTask\ncount_file: {count_file}\ntool_parser: ${{model.tool_parser}}\n"
    )
    run = Run(
        ["env=mcp_addition", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "trainer.num_sanity_val_steps=0", *overrides],
        tmp_path / "run",
    )
    # Seen while it runs, so that the checks know the processes the run must not leave.
    run.wait_for(lambda: any(b"tests.integration.mcp_server" in _cmdline(pid) for pid in run.track()), "the MCP server", 300)
    return run, count_file


@FAILING_FROM_INSIDE  # the group of runs that end on their own, of about equal length
def test_a_short_run_calls_the_mcp_servers_tools_and_stops_the_server(tmp_path):
    run, count_file = mcp_run(tmp_path, ["model.warm_start_steps=80", "model.warm_start_lr=3e-3", "trainer.max_steps=3"])
    run.wait_for(run.engine_serving, "the engine", 300)
    code, output, _ = run.finish(timeout_s=400)
    assert code == 0, output[-3000:]
    run.assert_nothing_left()  # the server (a child of the trainer) is gone with the run
    assert int(count_file.read_text()) > 0  # the server's own count of the calls it served
    rows = [row for row in read_rows(tmp_path / "run" / "metrics.csv") if "rollout/tool_calls/add" in row]
    # Trained episodes' calls, logged; the server also served held-out episodes and ones cut at the end.
    assert 0 < rows[-1]["rollout/tool_calls/add"] <= int(count_file.read_text())
    assert {
        f"rollout/tool_call_errors/{reason}" for reason in ("unparsable", "unknown_tool", "invalid_arguments", "tool_error", "timeout")
    } <= set(rows[-1])


@STOPPED_FROM_OUTSIDE
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_run_ended_by_a_signal_leaves_no_engine_no_mcp_server_and_no_temp_dir(tmp_path, signum):
    # SIGTERM: the run's own clean-up closes the task, which stops the server. SIGKILL: nothing in
    # the trainer runs; the reapers it started kill the engine's processes (which vLLM would leave
    # running, re-parented to init) and the server, and remove the engine's dirs.
    run, _ = mcp_run(tmp_path, ["trainer.max_steps=500", "checkpoint_every=1"])
    run.wait_for_training()
    os.kill(run.process.pid, signum)
    if signum == signal.SIGTERM:
        run.assert_stops(time.monotonic(), code=143)
    else:
        run.process.wait(timeout=10)
        started = time.monotonic()
        run.assert_nothing_left()
        assert time.monotonic() - started < 30  # processes and dirs within 10 s; the tracker's unlinks may take longer
