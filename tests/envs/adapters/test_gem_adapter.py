"""The gem-llm adapter: real gem games (skipped only where the `gem` extra is not installed)."""

import copy
import inspect
import pickle
import random
import sys
import threading

import pytest
from omegaconf import OmegaConf

from lit_asyncrl.envs.adapters import gem as gem_adapter
from lit_asyncrl.envs.adapters.global_rng import GlobalRandomState
from lit_asyncrl.rollout.serving.instances import held_out_instances, training_instance

MASTERMIND = "game:Mastermind-v0-easy"
GUESS = "game:GuessTheNumber-v0-easy"
PRINTABLE = set("\n" + "".join(chr(code) for code in range(32, 127)))


@pytest.fixture(scope="module")
def gem():
    return pytest.importorskip("gem", reason="gem-llm is not installed: pip install -e '.[gem]'")


@pytest.fixture(scope="module")
def mastermind(gem):
    return gem_adapter.GemEnv(MASTERMIND)


@pytest.fixture(scope="module")
def guess(gem):
    return gem_adapter.GemEnv(GUESS)


def _code(env, seed):
    return env.instance_key(seed).split("game_code=")[1]


def test_hand_played_mastermind_reaches_success_with_gems_observations(mastermind):
    assert (mastermind.turn_stop, mastermind.max_turns, mastermind.max_turn_tokens) == ("}", 10, 32)
    assert _code(mastermind, 0) == "[4, 6]"
    episode = mastermind.new_episode(0)
    first = episode.reset(seed=12345)  # the engine's seed is ignored: the instance is the game
    assert first.startswith("You are playing Mastermind.\nYou have to guess the secret 2 digit code within 10 turns.\n")
    assert "for example, \\boxed{1 3}.\n" in first and first.endswith("Enter your first guess to start the game.\n")
    assert len(first) == 659
    played = [episode.step(action) for action in ("\\boxed{1 2}", "\\boxed{3 4}", "\\boxed{5 6}", "\\boxed{4 6}")]
    assert [result.observation for result in played] == [
        "\nAt turn 1, you guessed [1, 2]. This guess receives 0 black peg(s) and 0 white peg(s).\n",
        "\nAt turn 2, you guessed [3, 4]. This guess receives 0 black peg(s) and 1 white peg(s).\n",
        "\nAt turn 3, you guessed [5, 6]. This guess receives 1 black peg(s) and 0 white peg(s).\n",
        "\nCongratulations! You guessed the correct code [4, 6] in 4 turns.\n",
    ]
    assert [result.reward for result in played] == [0.0, 0.0, 0.5, 0.5]  # progress: new black pegs / code length
    assert [(result.terminated, result.truncated, result.success) for result in played] == [
        (False, False, False)
    ] * 3 + [(True, False, True)]


def test_hand_played_guess_the_number_and_the_turn_limit(guess):
    assert (guess.max_turns, guess.append_suffix) == (4, False)
    win = guess.new_episode(0)  # the number is 7
    assert win.reset().startswith(
        "You are playing Guess The Number.\nYou have to guess the number between 1 and 10 (inclusive) within 4 turns.\n"
    )
    played = [win.step(action) for action in ("\\boxed{5}", "\\boxed{8}", "\\boxed{7}")]
    assert [(r.observation, r.reward, r.done, r.success) for r in played] == [
        ("\nAt turn 1, you guessed 5, and the target number is higher than 5.\n", 0.0, False, False),
        ("\nAt turn 2, you guessed 8, and the target number is lower than 8.\n", 0.0, False, False),
        ("\nCongratulations! You guessed the correct number 7 in 3 turns.\n", 1.0, True, True),
    ]
    lose = guess.new_episode(0)
    lose.reset()
    last = [lose.step(f"\\boxed{{{n}}}") for n in (1, 2, 3, 4)][-1]
    # gem pays a distance reward at the turn limit: positive, but not a success.
    assert (last.observation, last.terminated, last.truncated, last.success) == (
        "\nYou have reached the maximum number of turns.\n",
        True,
        True,
        False,
    )
    assert last.reward == pytest.approx(1 - 3 / 9)
    on_the_last_turn = guess.new_episode(0)
    on_the_last_turn.reset()
    assert [on_the_last_turn.step(f"\\boxed{{{n}}}").success for n in (1, 2, 3, 7)] == [False, False, False, True]


def test_malformed_and_invalid_actions(mastermind):
    episode = mastermind.new_episode(0)
    episode.reset()
    invalid = episode.step("\\boxed{1 2 3}")  # wrong length: gem's invalid action, the episode goes on
    assert (invalid.reward, invalid.done, invalid.success) == (0.0, False, False)
    malformed = episode.step("1 2}")  # no \boxed{...}: format error, the episode ends
    assert malformed.observation == "\nAt turn 2, you did not provide a valid guess.\n"
    assert (malformed.reward, malformed.terminated, malformed.success) == (-0.1, True, False)


@pytest.mark.parametrize(("env_id", "distinct"), [(MASTERMIND, 30), (GUESS, 10)])
def test_scripted_demonstrations_win_every_game(gem, env_id, distinct):
    env = gem_adapter.GemEnv(env_id)
    seeds_by_game = {}
    for seed in range(400):
        seeds_by_game.setdefault(env.instance_key(seed), seed)
    assert len(seeds_by_game) == distinct
    for seed in seeds_by_game.values():
        turns = env.demonstration(seed)
        assert len(turns) <= env.max_turns
        assert all(
            action.startswith("\\boxed{") and action.endswith(env.turn_stop) and len(action) <= env.max_turn_tokens
            for action, _ in turns
        )
        replay = env.new_episode(seed)
        replay.reset()
        results = [replay.step(action) for action, _ in turns]
        assert [r.observation for r in results] == [observation for _, observation in turns]
        assert results[-1].success and turns[-1][1].startswith("\nCongratulations!")


@pytest.mark.parametrize(("env_id", "expected"), [(MASTERMIND, 1 - (29 / 30) ** 10), (GUESS, 1 - 0.9**4)])
def test_random_play_stays_near_the_uniform_baseline(gem, env_id, expected):
    env, rng, wins, episodes = gem_adapter.GemEnv(env_id), random.Random(0), 0, 800
    for _ in range(episodes):
        episode = env.new_episode(training_instance(env, rng))
        episode.reset()
        for _ in range(env.max_turns):
            if env_id == MASTERMIND:
                action = "\\boxed{" + " ".join(map(str, rng.sample(range(1, 7), 2))) + "}"
            else:
                action = f"\\boxed{{{rng.randint(1, 10)}}}"
            result = episode.step(action)
            if result.done:
                wins += result.success
                break
    assert abs(wins / episodes - expected) < 0.05  # 0.288 / 0.344; 3 standard deviations


def test_held_out_games_are_never_trained_on(mastermind):
    held_out = sorted(_code(mastermind, seed) for seed in held_out_instances(mastermind, 3))
    assert held_out == ["[1, 3]", "[1, 4]", "[4, 1]"]  # a stable hash of the key: the same in every process
    rng = random.Random(1)
    trained = {_code(mastermind, training_instance(mastermind, rng)) for _ in range(600)}
    assert len(trained) == 27 and not trained & set(held_out)
    assert sorted(_code(mastermind, seed) for seed in held_out_instances(mastermind, 10)) == held_out  # the whole split
    same_code = [seed for seed in range(300) if _code(mastermind, seed) == "[1, 3]"]
    assert len(same_code) > 1 and all(
        mastermind.is_held_out(seed) for seed in same_code
    )  # the key is the code, not the seed


def test_compact_and_templated_instructions_keep_the_games_observations(gem):
    compact = gem_adapter.GemEnv(MASTERMIND, instructions="compact")
    episode = compact.new_episode(0)
    first = episode.reset()
    assert first == (
        "Mastermind: find the 2-digit code, digits 1-6, no repeats, in 10 guesses. Guess like \\boxed{1 2}. "
        "Black peg: right digit, right place. White peg: right digit, wrong place.\n"
    )
    assert (
        episode.step("\\boxed{4 6}").observation
        == "\nCongratulations! You guessed the correct code [4, 6] in 1 turns.\n"
    )
    guess_first = gem_adapter.GemEnv(GUESS, instructions="compact").new_episode(0).reset()
    assert (
        guess_first == "Guess the number from 1 to 10 in 4 guesses. Guess like \\boxed{1}. Hints say higher or lower.\n"
    )
    assert (
        gem_adapter.GemEnv(GUESS, instructions="Guess {min_number}-{max_number}:\n").new_episode(0).reset()
        == "Guess 1-10:\n"
    )
    with pytest.raises(ValueError, match="env.instructions=compact"):
        gem_adapter.GemEnv("game:Sudoku-v0-easy", instructions="compact")
    with pytest.raises(ValueError, match="env.instructions='{nope}'"):
        gem_adapter.GemEnv(GUESS, instructions="{nope}")


def test_texts_are_printable_ascii(mastermind, guess):
    for env in (mastermind, guess):
        for seed in range(20):
            episode = env.new_episode(seed)
            texts = [episode.reset()] + [episode.step(f"\\boxed{{{n} {n + 1}}}").observation for n in (1, 3)]
            assert set("".join(texts)) <= PRINTABLE


def test_board_games_show_their_board(gem):
    sudoku = gem_adapter.GemEnv("game:Sudoku-v0-easy")
    assert sudoku.append_suffix
    first = sudoku.new_episode(training_instance(sudoku, random.Random(0))).reset()
    assert "Here is the current board layout:\n" in first and first.endswith("Enter your move.\n")


def test_single_turn_rg_ids_score_and_drop_the_unicode_end_marker(gem):
    env = gem_adapter.GemEnv("rg:basic_arithmetic")
    assert env.max_turns == 1
    episode = env.new_episode(training_instance(env, random.Random(0)))
    episode.reset()
    right = episode.step("\\boxed{" + episode.game.data["answer"] + "}")
    assert (right.observation, right.reward, right.terminated, right.success) == ("", 1.0, True, True)
    assert "question=" in env.instance_key(3)


def test_bad_id_names_the_key(gem):
    with pytest.raises(ValueError, match="env.env_id='game:Nope'"):
        gem_adapter.GemEnv("game:Nope")


MOVES = ["\\boxed{up}", "\\boxed{left}", "\\boxed{down}", "\\boxed{right}"]


def _play_2048(episodes, rounds=12):
    """Interleaves the episodes turn by turn; each one's (observation, board, reward) list."""
    played = [[episode.reset()] for episode in episodes]
    for turn in range(rounds):
        for index, episode in enumerate(episodes):
            result = episode.step(MOVES[turn % 4])
            played[index].append((result.observation, result.info["suffix"], result.reward))
    return played


def test_interleaved_episodes_play_as_they_would_alone(gem):
    # Game2048 draws a new tile from the global `random` after every move: without the per-episode
    # state, interleaving would change the boards.
    env = gem_adapter.GemEnv("game:Game2048-v0-easy")
    seeds = [11, 12, 13, 14, 15, 16]
    outside = random.getstate()
    alone = {seed: _play_2048([env.new_episode(seed)])[0] for seed in seeds}
    assert len({str(play) for play in alone.values()}) == len(seeds)
    together = _play_2048([env.new_episode(seed) for seed in seeds])
    assert together == [alone[seed] for seed in seeds]
    assert random.getstate() == outside  # the process's own generator is untouched

    threaded = {seed: [] for seed in seeds}
    barrier = threading.Barrier(len(seeds))

    def play(seed):
        episode = env.new_episode(seed)
        threaded[seed].append(episode.reset())
        for turn in range(12):
            barrier.wait()  # every thread steps at once: the calls interleave in any order
            result = episode.step(MOVES[turn % 4])
            threaded[seed].append((result.observation, result.info["suffix"], result.reward))

    threads = [threading.Thread(target=play, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert threaded == alone


def test_global_random_state_is_private_per_owner():
    first, second = GlobalRandomState(1), GlobalRandomState(2)
    outside = random.getstate()
    with first.active():
        a1 = random.random()
    with second.active():
        b1 = random.random()
    with first.active():
        a2 = random.random()
    assert random.getstate() == outside
    reference = random.Random(1)
    assert [a1, a2] == [reference.random(), reference.random()]
    assert b1 == random.Random(2).random()


def test_missing_extra_fails_at_once_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gem", None)  # `import gem` now raises ImportError

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the extra was checked")

    monkeypatch.setattr(gem_adapter, "GlobalRandomState", no_work)
    with pytest.raises(ImportError, match=r"env=gem needs the 'gem' extra: pip install -e \"\.\[gem\]\""):
        gem_adapter.GemEnv()


def test_hydra_config_lists_every_argument_with_its_default():
    from lit_asyncrl.config_dir import config_dir

    config = OmegaConf.to_container(OmegaConf.load(f"{config_dir()}/env/gem.yaml"))
    assert (
        config.pop("_target_") == "lit_asyncrl.envs.adapters.gem.GemEnv"
    )  # a module path: lit_asyncrl.envs imports without the extra
    signature = inspect.signature(gem_adapter.GemEnv)
    assert config == {key: parameter.default for key, parameter in signature.parameters.items()}


def test_copies_and_pickles(gem):
    env = gem_adapter.GemEnv()
    for clone in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        episode = clone.new_episode(training_instance(clone, random.Random(0)))
        assert episode.reset() == env.new_episode(training_instance(env, random.Random(0))).reset()
