"""A mixture of tasks (`TaskMix`): draws by weight, per-task splits and settings, lifecycle, refusals."""

from __future__ import annotations

import random

import pytest

from lit_asyncrl.envs import BalancedTaskMix, GuessNumberEnv, MixInstance, ServiceDeskEnv, TaskMix
from lit_asyncrl.envs.base import Environment, TaskInstance
from lit_asyncrl.envs.mixture import keep_rate
from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.for_task import episode_formats_for
from lit_asyncrl.rollout.episodes.formats import PlainFormat
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_instance
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory, task_columns
from lit_asyncrl.rollout.serving.instances import held_out_instances, training_instance
from lit_asyncrl.warm_start import demonstration_trajectories
from tests.support.scripted_engine import ids, scripted_engine


def two_tasks(**weights) -> TaskMix:
    return TaskMix({"desk": ServiceDeskEnv(), "guess": GuessNumberEnv()}, weights=weights or None)


def test_a_single_environment_is_its_own_only_task():
    env = GuessNumberEnv()
    assert env.tasks() == {None: env}
    assert env.task_of(7) == TaskInstance(None, env, 7)


def test_training_draws_follow_the_weights_and_stay_out_of_each_tasks_held_out_split():
    mix = two_tasks(desk=3.0)  # guess left out: weight 1
    rng = random.Random(0)
    draws = [training_instance(mix, rng) for _ in range(4000)]
    desk_share = sum(draw.task == "desk" for draw in draws) / len(draws)
    assert desk_share == pytest.approx(0.75, abs=0.03)
    tasks = mix.tasks()
    assert not any(tasks[draw.task].is_held_out(draw.instance) for draw in draws)
    # Guess-the-number holds secrets 3 and 8 out: its training draws never show them.
    assert {draw.instance for draw in draws if draw.task == "guess"} == set(range(1, 11)) - {3, 8}
    assert training_instance(two_tasks(), random.Random(1)).task in ("desk", "guess")
    even = [training_instance(two_tasks(), rng).task for _ in range(4000)]
    assert even.count("desk") / len(even) == pytest.approx(0.5, abs=0.03)


def test_held_out_instances_are_shared_evenly_and_come_from_each_tasks_own_split():
    mix = two_tasks()
    held_out = held_out_instances(mix, 5, seed=0)
    # 5 over 2 tasks: 3 + 2, except that guess-the-number holds out only 2 secrets.
    assert [instance.task for instance in held_out] == ["desk", "desk", "desk", "guess", "guess"]
    assert sorted(instance.instance for instance in held_out if instance.task == "guess") == [3, 8]
    desk = mix.tasks()["desk"]
    assert [i.instance for i in held_out if i.task == "desk"] == held_out_instances(desk, 3, seed=0)
    assert all(mix.is_held_out(instance) for instance in held_out)
    assert held_out_instances(mix, 5, seed=0) == held_out  # the same for the same seed
    # Fewer instances asked than tasks: each task still gets one.
    assert [instance.task for instance in held_out_instances(mix, 1, seed=0)] == ["desk", "guess"]


def test_instances_are_played_and_demonstrated_by_their_own_task():
    mix = two_tasks()
    instance = MixInstance("guess", 7)
    task = mix.task_of(instance)
    assert task.name == "guess" and task.env is mix.tasks()["guess"] and task.instance == 7
    assert mix.demonstration(instance) == GuessNumberEnv().demonstration(7)
    assert mix.instance_key(instance) == "guess/7"
    assert mix.new_episode(instance).reset(0) == GuessNumberEnv().new_episode(7).reset(0)


def test_each_task_plays_in_its_own_format_with_its_own_stop_text():
    tokenizer = build_char_tokenizer()
    mix = two_tasks()
    formats = episode_formats_for(tokenizer, mix)
    assert set(formats) == {"desk", "guess"} and all(isinstance(f, PlainFormat) for f in formats.values())
    # Guess-the-number's turns end at ';', the desk's at a newline.
    assert formats["guess"].stop_token_ids[0] == ids(tokenizer, ";")[0]
    assert formats["desk"].stop_token_ids[0] == ids(tokenizer, "\n")[0]

    engine = scripted_engine(tokenizer, ["3;", "7;"])  # secret 7: H after 3, W after 7
    caller = EnvCaller(max_workers=1)
    try:
        settings = EpisodeSettings(
            call_env=caller, sampling=SamplingSettings(temperature=1.0, top_k=-1), max_context=512
        )
        coroutine = play_instance(engine, mix, formats, MixInstance("guess", 7), Trajectory(group_id=0), settings)
        trajectory = engine.run(coroutine, timeout_s=30)
    finally:
        caller.close()
        engine.shutdown()
    assert trajectory.task == "guess" and trajectory.success and trajectory.num_turns == 2
    # The game's own stop text and turn length, not the desk's.
    guess = mix.tasks()["guess"]
    assert [(request["stop"], request["max_tokens"]) for request in engine.requests] == [
        (formats["guess"].stop_token_ids, guess.max_turn_tokens)
    ] * 2
    assert guess.max_turn_tokens != mix.tasks()["desk"].max_turn_tokens
    assert trajectory.token_ids == [tokenizer.bos_token_id, *ids(tokenizer, "?3;H7;")]


def test_demonstrations_of_a_mixture_carry_their_tasks_format_and_name():
    tokenizer = build_char_tokenizer()
    mix = two_tasks()
    trajectories = demonstration_trajectories(mix, episode_formats_for(tokenizer, mix), 40, random.Random(0))
    assert {trajectory.task for trajectory in trajectories} == {"desk", "guess"}
    for trajectory in trajectories:
        text = tokenizer.decode(trajectory.token_ids, skip_special_tokens=True)
        # the desk's requests start with "user:", the game's prompt is "?"
        assert text.startswith("user:") if trajectory.task == "desk" else text.startswith("?")


def test_task_columns_index_each_row_into_the_names():
    rows = [
        Trajectory(group_id=0, task="guess"),
        Trajectory(group_id=0, task="desk"),
        Trajectory(group_id=1, task="guess"),
    ]
    columns = task_columns(rows, ("desk", "guess"))
    assert columns["task_ids"].tolist() == [1, 0, 1] and columns["task_names"] == ("desk", "guess")


class Recorder(Environment):
    """Records start/close calls in a shared log; `fail` raises in that call."""

    def __init__(self, name: str, log: list, fail: str | None = None) -> None:
        super().__init__()
        self.name, self.log, self.fail = name, log, fail

    def generate_instance(self, rng):
        return rng.random()

    def new_episode(self, instance):
        raise NotImplementedError

    def start(self, make_engine=None) -> None:
        self.log.append(("start", self.name))
        self.make_engine = make_engine
        if self.fail == "start":
            raise RuntimeError(f"{self.name} start")

    def close(self) -> None:
        self.log.append(("close", self.name))
        if self.fail == "close":
            raise RuntimeError(f"{self.name} close")


def test_start_and_close_reach_every_task_and_a_failure_still_closes_the_others():
    log: list = []
    tasks = {"a": Recorder("a", log), "b": Recorder("b", log, fail="close"), "c": Recorder("c", log)}
    mix = TaskMix(tasks)
    mix.start(make_engine := object())
    assert [task.make_engine for task in tasks.values()] == [
        make_engine
    ] * 3  # the runner's engine maker reaches every task
    with pytest.raises(RuntimeError, match="b close"):
        mix.close()
    assert log == [("start", "a"), ("start", "b"), ("start", "c"), ("close", "a"), ("close", "b"), ("close", "c")]

    log.clear()
    mix = TaskMix({"a": Recorder("a", log), "b": Recorder("b", log, fail="start"), "c": Recorder("c", log)})
    with pytest.raises(RuntimeError, match="b start"):
        mix.start()
    # The task that started is closed again; the one after the failure never started.
    assert log == [("start", "a"), ("start", "b"), ("close", "a")]


@pytest.mark.parametrize(
    ("tasks", "weights", "message"),
    [
        ({}, None, "env.tasks must name at least one task"),
        ({"Desk": GuessNumberEnv()}, None, "task name 'Desk' must be lower-case"),
        ({"a/b": GuessNumberEnv()}, None, "task name 'a/b'"),
        ({"desk": "service_desk"}, None, "env.tasks.desk must be an Environment, got str"),
        ({"mix": TaskMix({"g": GuessNumberEnv()})}, None, "env.tasks.mix is a TaskMix itself"),
        ({"g": GuessNumberEnv()}, {"desk": 1.0}, r"env.weights.desk: no such task \(tasks: g\)"),
        ({"g": GuessNumberEnv()}, {"g": 0}, "env.weights.g must be a number > 0, got 0"),
        ({"g": GuessNumberEnv()}, {"g": float("inf")}, "env.weights.g must be a number > 0, got inf"),
        ({"g": GuessNumberEnv()}, {"g": True}, "env.weights.g must be a number > 0, got True"),
    ],
)
def test_bad_mixtures_are_refused_naming_the_key(tasks, weights, message):
    with pytest.raises(ValueError, match=message):
        TaskMix(tasks, weights=weights)


def test_keep_rate_is_the_smoothed_share_of_finished_episodes_trained():
    counts = {"desk/trained": 99, "desk/dropped_stale": 100, "desk/produced": 260, "guess/trained": 7}
    assert keep_rate(counts, "desk") == 100 / 200
    assert keep_rate(counts, "guess") == 1.0  # nothing dropped
    assert keep_rate(counts, "other") == 1.0  # nothing finished yet: drawn by its weight


def test_a_balanced_mixture_draws_each_task_by_its_weight_over_its_keep_rate():
    rng = random.Random(0)
    balanced = BalancedTaskMix({"desk": ServiceDeskEnv(), "guess": GuessNumberEnv()}, weights={"guess": 2.0})
    # Before any accounting: by the weights, 1 : 2.
    first = [training_instance(balanced, rng).task for _ in range(6000)]
    assert first.count("desk") / len(first) == pytest.approx(1 / 3, abs=0.02)
    # Half the desk's finished episodes were dropped as stale (keep rate 0.5), none of the game's:
    # draws 1 / 0.5 : 2 / 1 = 1 : 1, so that the trained mix comes out 1 : 2 again.
    counts = {"desk/trained": 99, "desk/dropped_stale": 100, "guess/trained": 199}
    second = [training_instance(balanced, rng, counts).task for _ in range(6000)]
    assert second.count("desk") / len(second) == pytest.approx(1 / 2, abs=0.02)
    # The plain mixture ignores the accounting.
    plain = TaskMix({"desk": ServiceDeskEnv(), "guess": GuessNumberEnv()}, weights={"guess": 2.0})
    third = [training_instance(plain, rng, counts).task for _ in range(6000)]
    assert third.count("desk") / len(third) == pytest.approx(1 / 3, abs=0.02)
