"""A listed task's training instances come in epochs: each a shuffled pass over the list, the same for
the same seed, shared by several drawing threads without a repeat, continued from a checkpoint's
position; other tasks keep drawing from the producer's random generator."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.envs.guess_number import GuessNumberEnv
from lit_asyncrl.envs.mixture import MixInstance, TaskMix
from lit_asyncrl.rollout.serving.epochs import EpochOrder
from lit_asyncrl.rollout.serving.instances import TrainingDraws

LETTERS = list("abcdefghij")


class Listed(Environment):
    """Ten training instances, the letters a-j; `generate_instance` must never be asked."""

    def training_instances(self) -> list[str]:
        return LETTERS

    def generate_instance(self, rng: random.Random) -> str:  # pragma: no cover - a listed task deals
        raise AssertionError("a listed task's instances are dealt in epochs, not generated")

    def new_episode(self, instance):  # pragma: no cover - never played here
        raise NotImplementedError


def deal(order: EpochOrder, count: int) -> list[str]:
    return [order.next() for _ in range(count)]


def test_each_epoch_is_every_instance_once_in_an_order_of_its_own():
    dealt = deal(EpochOrder(LETTERS, seed=0), 30)
    epochs = [dealt[:10], dealt[10:20], dealt[20:]]
    assert all(sorted(epoch) == LETTERS for epoch in epochs)
    # Shuffled, and shuffled anew each epoch (10! orders: a repeat here would be a bug, not chance).
    assert epochs[0] != LETTERS and epochs[0] != epochs[1] != epochs[2]


def test_the_seed_fixes_the_order():
    assert deal(EpochOrder(LETTERS, seed=7), 20) == deal(EpochOrder(LETTERS, seed=7), 20)
    assert deal(EpochOrder(LETTERS, seed=7), 10) != deal(EpochOrder(LETTERS, seed=8), 10)


def test_a_restored_order_continues_where_the_checkpoint_was():
    uninterrupted = deal(EpochOrder(LETTERS, seed=3), 25)
    first = EpochOrder(LETTERS, seed=3)
    before = deal(first, 13)  # into the second epoch
    assert first.state_dict() == {"epoch": 1, "position": 3, "size": 10}
    assert first.epochs_started == pytest.approx(1.3)
    resumed = EpochOrder(LETTERS, seed=3)
    resumed.load_state_dict(first.state_dict(), "env")
    assert before + deal(resumed, 12) == uninterrupted


def test_a_checkpoint_of_another_dataset_size_is_refused():
    saved = EpochOrder(LETTERS, seed=0).state_dict()
    with pytest.raises(ValueError, match=r"env.tasks.math lists 9 training instances, the checkpoint's run listed 10"):
        EpochOrder(LETTERS[:9], seed=0).load_state_dict(saved, "env.tasks.math")


def test_threads_drawing_at_once_deal_each_instance_once_per_epoch():
    order = EpochOrder(list(range(100)), seed=1)
    dealt: list[int] = []
    lock = threading.Lock()

    def draw_many() -> None:
        mine = [order.next() for _ in range(250)]
        with lock:
            dealt.extend(mine)

    threads = [threading.Thread(target=draw_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # 1,000 draws of 100 instances: ten whole epochs, each instance ten times.
    assert Counter(dealt) == Counter({instance: 10 for instance in range(100)})
    assert order.state_dict() == {"epoch": 9, "position": 100, "size": 100}


def test_a_listed_task_is_dealt_and_its_position_saved():
    draws = TrainingDraws(Listed(), seed=5)
    rng = random.Random(0)
    dealt = [draws.draw(rng, {}) for _ in range(4)]
    assert dealt == deal(EpochOrder(LETTERS, seed=5), 4)
    assert draws.stats() == {"rollout/epochs": pytest.approx(0.4)}
    assert draws.state_dict() == {None: {"epoch": 0, "position": 4, "size": 10}}
    resumed = TrainingDraws(Listed(), seed=5)
    resumed.load_state_dict(draws.state_dict())
    assert dealt + [resumed.draw(rng, {}) for _ in range(6)] == deal(EpochOrder(LETTERS, seed=5), 10)


def test_a_task_without_a_list_draws_from_the_producers_generator():
    env = GuessNumberEnv()
    draws = TrainingDraws(env, seed=5)
    assert draws.epochs == {} and draws.stats() == {} and draws.state_dict() == {}
    drawn = [draws.draw(random.Random(9), {}) for _ in range(3)]
    assert drawn[0] == drawn[1] == drawn[2]  # the same generator state gives the same instance
    assert not env.is_held_out(drawn[0])


def test_a_mixture_deals_its_listed_task_in_epochs_and_draws_the_other():
    mix = TaskMix({"letters": Listed(), "game": GuessNumberEnv()})
    draws = TrainingDraws(mix, seed=2)
    rng = random.Random(4)
    drawn = [draws.draw(rng, {}) for _ in range(40)]
    letters = [instance.instance for instance in drawn if instance.task == "letters"]
    assert all(isinstance(instance, MixInstance) for instance in drawn)
    assert 0 < len(letters) < 40
    assert letters == deal(EpochOrder(LETTERS, seed=2), len(letters))
    assert draws.stats() == {"rollout/epochs/letters": pytest.approx(len(letters) / 10)}
