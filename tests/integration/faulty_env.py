"""An environment that fails (for the cleanup tests); slowness is `env.latency_s`."""

from lit_asyncrl.envs import GuessNumberEnv


class EnvironmentFault(RuntimeError):
    pass


class _FaultyEpisode:
    def __init__(self, inner, counter: list[int], fail_after: int, fail_every: int | None) -> None:
        self.inner, self.counter, self.fail_after, self.fail_every = inner, counter, fail_after, fail_every

    def reset(self, seed=None) -> str:
        return self.inner.reset(seed)

    def step(self, action: str):
        self.counter[0] += 1
        if self.counter[0] > self.fail_after:
            raise EnvironmentFault(f"tool crashed on turn {self.counter[0]}")
        if self.fail_every is not None and self.counter[0] % self.fail_every == 0:
            raise EnvironmentFault(f"tool hiccup on turn {self.counter[0]}")
        return self.inner.step(action)


class FaultyGuessNumberEnv(GuessNumberEnv):
    """Guess-the-number whose agent turns (counted over all episodes) raise from the
    `fail_after + 1`-th on, and every `fail_every`-th one before that."""

    def __init__(self, fail_after: int = 200, fail_every: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_after, self.fail_every = fail_after, fail_every
        self._counter = [0]

    def new_episode(self, instance: int):
        return _FaultyEpisode(super().new_episode(instance), self._counter, self.fail_after, self.fail_every)
