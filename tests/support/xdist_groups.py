"""Groups of tests that `--dist loadgroup` runs on one worker."""

from pathlib import Path

import pytest

from lit_asyncrl.config_dir import config_dir

#: The fast tests that import vLLM (its tool parsers, its engine arguments): on one worker, so only
#: that worker pays vLLM's import (~3 s on a 2-core machine), not both.
imports_vllm = pytest.mark.xdist_group("imports_vllm")


#: The shipped tool tasks (`conf/env/<name>.yaml`); tau2's also imports tau2 (a second reason to share the worker).
TOOL_TASKS = {"service_desk_tools", "tau2"}


def builds_a_tool_task(overrides: list[str]) -> bool:
    """Whether a run of Hydra `overrides` plays a tool task, whose calls vLLM's tool parsers read
    (so building it imports vLLM)."""
    chosen = {token.split("=", 1)[1] for token in overrides if token.startswith(("experiment=", "env="))}
    experiments = [Path(config_dir()) / "experiment" / f"{name}.yaml" for name in chosen]
    return bool(chosen & TOOL_TASKS) or any(
        f"/env: {task}" in path.read_text() for path in experiments if path.exists() for task in TOOL_TASKS
    )


def grouped_by_imports(overrides: list[str]) -> list:
    """`overrides`' marks: the `imports_vllm` group for a run that plays a tool task."""
    return [imports_vllm] if builds_a_tool_task(overrides) else []


#: The runs of the cleanup tests (and of others that compare listings as they do), in two groups of
#: about equal length, each one test after another: runs that fail from inside and runs stopped from
#: outside, so at most two lifecycle runs share the machine.
FAILING_FROM_INSIDE = pytest.mark.xdist_group("cleanup_failures")
STOPPED_FROM_OUTSIDE = pytest.mark.xdist_group("cleanup_signals")
