"""A lane's engine whose start hangs is shut down and made once more (pure logic, over engines that
only start or time out)."""

import pytest

from lit_asyncrl.rollout.engine.protocol import EngineStartTimeout
from lit_asyncrl.rollout.serving.lanes import EngineLanes


class StartingEngine:
    """An engine whose start serves or times out, as told; it records its version and its shutdown."""

    def __init__(self, version: int, hangs: bool) -> None:
        self.version = version
        self.hangs = hangs
        self.shut_down = False

    def wait_until_serving(self, timeout_s: float = 300.0) -> None:
        if self.hangs:
            raise EngineStartTimeout("vLLM engine did not start within 300 s (the starting thread was at x)")

    def shutdown(self, startup_timeout_s: float = 300.0) -> None:
        self.shut_down = True


def lanes_whose_starts(*hangs: bool) -> tuple[EngineLanes, list[StartingEngine]]:
    """Two lanes whose engines, in the order they are made, hang or serve as `hangs` says."""
    made: list[StartingEngine] = []

    def new_engine(version: int) -> StartingEngine:
        made.append(StartingEngine(version, hangs[len(made)]))
        return made[-1]

    return EngineLanes(2, new_engine), made


def test_an_engine_whose_start_hangs_is_shut_down_and_made_once_more_at_the_lanes_version():
    lanes, made = lanes_whose_starts(True, False)

    with pytest.warns(
        UserWarning,
        match=r"the vLLM engine 1 did not start; making it once more: vLLM engine did not start within 300 s",
    ):
        engine = lanes.engine_up(1, version=7)

    first, second = made
    assert (first.shut_down, second.shut_down) == (True, False)
    assert engine is second and second.version == 7
    assert lanes.engines == [None, second]


def test_a_second_start_that_hangs_is_raised():
    lanes, made = lanes_whose_starts(True, True)

    with pytest.warns(UserWarning, match="making it once more"), pytest.raises(EngineStartTimeout):
        lanes.engine_up(0, version=0)

    assert len(made) == 2


def test_an_engine_launched_early_that_serves_is_taken_as_it_is():
    lanes, made = lanes_whose_starts(False, False)
    lanes.launch_early()

    assert lanes.engine_up(0, version=3) is made[0]
    assert [engine.version for engine in made] == [0, 0]  # launched at 0; the caller pushes version 3
