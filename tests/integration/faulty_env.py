"""An environment that fails (for the cleanup tests); slowness is `env.latency_s`."""

from lit_asyncrl.envs import GuessNumberEnv


class EnvironmentFault(RuntimeError):
    pass


class _FaultyEpisode:
    def __init__(self, inner, counter: list[int], fail_after: int) -> None:
        self.inner, self.counter, self.fail_after = inner, counter, fail_after

    def reset(self, seed=None) -> str:
        return self.inner.reset(seed)

    def step(self, action: str):
        self.counter[0] += 1
        if self.counter[0] > self.fail_after:
            raise EnvironmentFault(f"tool crashed on turn {self.counter[0]}")
        return self.inner.step(action)


class FaultyGuessNumberEnv(GuessNumberEnv):
    """Guess-the-number whose `fail_after + 1`-th agent turn (over all episodes) raises."""

    def __init__(self, fail_after: int = 200, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_after = fail_after
        self._counter = [0]

    def new_episode(self, instance: int):
        return _FaultyEpisode(super().new_episode(instance), self._counter, self.fail_after)
