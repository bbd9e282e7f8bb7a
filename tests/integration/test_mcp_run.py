"""A few training steps against an MCP server's tools on the real engine: the server counts the calls
it served, and the run leaves nothing behind (no server, no file), however it ends."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.runs import read_rows
from tests.support.tracked_runs import Run, _cmdline
from tests.support.xdist_groups import FAILING_FROM_INSIDE, STOPPED_FROM_OUTSIDE

# Compares listings, as the cleanup tests do, and runs in their groups.
pytestmark = pytest.mark.engine


#: The desk with a customer played by a model (the tiny one, to be quick) on an engine of its own.
DESK_WITH_A_MODEL_CUSTOMER = """\
_target_: lit_asyncrl.envs.ServiceDeskEnv
max_turns: 5
user:
  _target_: lit_asyncrl.envs.LLMUser
  model: tiny
  max_reply_tokens: 4
  temperature: 0.7
  kv_cache_gib: 0.25
"""


def mcp_run(tmp_path: Path, overrides: list[str], with_customer: bool = False) -> tuple[Run, Path]:
    """A Hydra run of the MCP addition task (`mcp_task.py`), once its server is up; and the server's
    count file. `with_customer`: a mixture of that task and the desk whose customer is a model."""
    count_file, config_dir = tmp_path / "served", tmp_path / "conf" / "env"
    config_dir.mkdir(parents=True)
    addition = f"_target_: tests.integration.mcp_task.McpAdditionTask\ncount_file: {count_file}\ntool_parser: ${{model.tool_parser}}\n"
    (config_dir / "mcp_addition.yaml").write_text(addition)
    mixture = ["_target_: lit_asyncrl.envs.TaskMix", "tasks:", "  mcp_addition:", *indented(addition, 4)]
    mixture += ["  desk_customer:", *indented(DESK_WITH_A_MODEL_CUSTOMER, 4)]
    (config_dir / "mcp_and_customer.yaml").write_text("\n".join(mixture) + "\n")
    env = "env=mcp_and_customer" if with_customer else "env=mcp_addition"
    run = Run(
        [env, f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "trainer.num_sanity_val_steps=0", *overrides],
        tmp_path / "run",
    )
    # Seen while it runs, so that the checks know the processes the run must not leave.
    run.wait_for(
        lambda: any(b"tests.integration.mcp_server" in _cmdline(pid) for pid in run.track()), "the MCP server", 300
    )
    return run, count_file


def indented(text: str, spaces: int) -> list[str]:
    return [" " * spaces + line for line in text.splitlines()]


@FAILING_FROM_INSIDE  # the group of runs that end on their own, of about equal length
def test_a_short_run_calls_the_mcp_servers_tools_and_stops_the_server(tmp_path):
    run, count_file = mcp_run(
        tmp_path, ["model.warm_start_steps=80", "model.warm_start_lr=3e-3", "trainer.max_steps=3"]
    )
    run.wait_for(run.engine_serving, "the engine", 300)
    code, output, _ = run.finish(timeout_s=400)
    assert code == 0, output[-3000:]
    run.assert_nothing_left()  # the server (a child of the trainer) is gone with the run
    assert int(count_file.read_text()) > 0  # the server's own count of the calls it served
    rows = [row for row in read_rows(tmp_path / "run" / "metrics.csv") if "rollout/tool_calls/add" in row]
    # Trained episodes' calls, logged; the server also served held-out episodes and ones cut at the end.
    assert 0 < rows[-1]["rollout/tool_calls/add"] <= int(count_file.read_text())
    assert {
        f"rollout/tool_call_errors/{reason}"
        for reason in ("unparsable", "unknown_tool", "invalid_arguments", "tool_error", "timeout")
    } <= set(rows[-1])


@FAILING_FROM_INSIDE
def test_a_dead_old_logit_worker_fails_an_mcp_run_within_seconds_naming_it_and_the_server_stops(tmp_path):
    # A run that ends on an exception: the dedicated old-logit worker is killed, the run names it
    # and stops, and its clean-up stops the MCP server with the engine.
    run, _ = mcp_run(tmp_path, ["experiment=dedicated", "trainer.max_steps=500", "checkpoint_every=1"])
    run.wait_for_training()
    (worker,) = run.worker_pids()
    os.kill(worker, signal.SIGKILL)
    run.assert_stops(time.monotonic(), says=f"the dedicated old-logit worker (pid {worker}) exited with code -9")


@STOPPED_FROM_OUTSIDE
def test_sigterm_between_training_steps_ends_the_customers_engine_and_the_mcp_server(tmp_path):
    # A mixture of the MCP task and the desk whose customer is a model on a second engine: SIGTERM
    # between training steps, and the run's own clean-up stops both engines and the server.
    run, _ = mcp_run(
        tmp_path, ["trainer.max_steps=500", "checkpoint_every=1", "rollout.max_model_len=512"], with_customer=True
    )
    run.wait_for_training()
    assert len(run.engine_cores()) == 2  # the policy's and the customer's
    run.process.send_signal(signal.SIGTERM)
    run.assert_stops(time.monotonic(), code=143)


@STOPPED_FROM_OUTSIDE
def test_a_sigkilled_run_leaves_no_engine_no_mcp_server_and_no_temp_dir(tmp_path):
    # Nothing in the trainer runs; the reapers it started kill the engine's processes (which vLLM
    # would leave running, re-parented to init) and the server, and remove the engine's dirs.
    run, _ = mcp_run(tmp_path, ["trainer.max_steps=500", "checkpoint_every=1"])
    run.wait_for_training()
    os.kill(run.process.pid, signal.SIGKILL)
    run.process.wait(timeout=10)
    started = time.monotonic()
    run.assert_nothing_left()
    assert time.monotonic() - started < 30  # processes and dirs within 10 s; the tracker's unlinks may take longer
