"""The reasoning-gym adapter: real reasoning-gym tasks (skipped only where the extra is not installed)."""

import copy
import inspect
import pickle
import random
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from omegaconf import OmegaConf

from lit_asyncrl.envs.adapters import reasoning_gym as reasoning_gym_adapter
from lit_asyncrl.envs.adapters.reasoning_gym import PRINTABLE, ReasoningGymEnv, extract_answer
from lit_asyncrl.rollout.serving.instances import held_out_instances, training_instance


@pytest.fixture(scope="module")
def rg():
    return pytest.importorskip(
        "reasoning_gym", reason="reasoning-gym is not installed: pip install -e '.[reasoning-gym]'"
    )


@pytest.fixture(scope="module")
def arithmetic(rg):
    return ReasoningGymEnv("basic_arithmetic", size=200, seed=42)


def test_prompt_answer_and_score(arithmetic):
    assert (arithmetic.max_turns, arithmetic.turn_stop, arithmetic.max_turn_tokens) == (1, "\n", 32)
    episode = arithmetic.new_episode(0)
    assert episode.reset(seed=7) == "Calculate -5 * -6.\n"
    right = episode.step("30\n")
    assert (right.observation, right.reward, right.terminated, right.truncated, right.success) == (
        "",
        1.0,
        True,
        False,
        True,
    )
    for answer in (" 30 \n", "\\boxed{30}", "so \\boxed{30}\n"):
        assert arithmetic.new_episode(0).step(answer).success, answer
    wrong = arithmetic.new_episode(0).step("31\n")
    assert (wrong.reward, wrong.done, wrong.success) == (0.0, True, False)


def test_reward_is_the_tasks_own_score_and_success_only_a_full_score(rg):
    env = ReasoningGymEnv("spell_backward", size=20, seed=42)
    assert env.prompt(0) == "Spell this word backward (example: sun -> nus): requiz\n"
    near = env.new_episode(0).step("ziuqe\n")  # the scorer gives partial credit
    assert near.reward == pytest.approx(env.dataset.score_answer("ziuqe", env.entry(0))) == pytest.approx(5 / 6)
    assert not near.success
    assert env.new_episode(0).step("ZIUQER\n").success


def test_held_out_questions_are_never_trained_on(rg):
    env = ReasoningGymEnv("chain_sum", size=400, seed=42)
    questions = [env.entry(index)["question"] for index in range(env.size)]
    assert len(set(questions)) < env.size  # the dataset repeats some questions under other indices
    held_out = {questions[index] for index in range(env.size) if env.is_held_out(index)}
    assert 0.1 < len(held_out) / len(set(questions)) < 0.3
    rng = random.Random(0)
    trained = {questions[training_instance(env, rng)] for _ in range(2000)}
    assert not trained & held_out
    evaluated = {questions[index] for index in held_out_instances(env, 20)}
    assert len(evaluated) == 20 and evaluated <= held_out


def test_demonstration_is_the_entrys_answer(arithmetic, rg):
    assert arithmetic.demonstration(0) == [("30\n", "")]
    sudoku = ReasoningGymEnv("mini_sudoku", size=5, seed=42)
    with pytest.raises(ValueError, match="turn_stop"):
        sudoku.demonstration(0)  # the answer spans lines
    boxed = ReasoningGymEnv("mini_sudoku", size=5, seed=42, turn_stop="}", max_turn_tokens=64)
    ((action, _),) = boxed.demonstration(0)
    assert action == boxed.entry(0)["answer"] + "}"


def test_config_and_prompt_template(rg):
    env = ReasoningGymEnv(
        "chain_sum",
        size=10,
        config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        prompt="Q: {question}\nA: ",
    )
    assert env.prompt(0) == "Q: State the final answer to the following arithmetic problem: 4 + 3 =\nA: "
    with pytest.raises(ValueError, match="env.config"):
        ReasoningGymEnv("chain_sum", config={"bogus": 1})
    with pytest.raises(ValueError, match="env.task='nope'"):
        ReasoningGymEnv("nope")


def test_ascii_only_keeps_entries_the_character_tokenizer_encodes(rg):
    mixed = ReasoningGymEnv("complex_arithmetic", size=100, seed=42)
    assert any(not set(mixed.prompt(index)) <= PRINTABLE for index in range(mixed.size))  # `×`, `÷`
    clean = ReasoningGymEnv("complex_arithmetic", size=100, seed=42, ascii_only=True)
    rng = random.Random(0)
    for _ in range(200):
        index = training_instance(clean, rng)
        assert set(clean.prompt(index)) <= PRINTABLE and set(clean.entry(index)["answer"]) <= PRINTABLE


@pytest.mark.parametrize("task", ["basic_arithmetic", "chain_sum", "leg_counting"])
def test_small_tasks_fit_the_character_tokenizer(rg, task):
    env = ReasoningGymEnv(task, size=100, seed=42)
    for index in range(env.size):
        assert set(env.prompt(index)) <= PRINTABLE
        assert len(env.prompt(index)) <= 300
        assert env.demonstration(index)[0][0] == str(env.entry(index)["answer"]) + "\n"


def test_concurrent_episodes_score_as_they_would_alone(arithmetic):
    indices = list(range(40))
    alone = [arithmetic.new_episode(index).step(str(index) + "\n") for index in indices]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda index: arithmetic.new_episode(index).step(str(index) + "\n"), indices))
    assert together == alone


def test_extract_answer():
    assert extract_answer("42\n", "\n") == "42"
    assert extract_answer("x \\boxed{a{b}c} y \\boxed{7}", "\n") == "7"
    assert extract_answer("\\boxed{1 2}", "}") == "1 2"
    assert extract_answer("\\boxed{unclosed", "\n") == "\\boxed{unclosed"
    assert extract_answer("4 + 6 = 10\n", "\n", "last_number") == "10"
    assert extract_answer("It is -2.5, not 3.", "\n", "last_number") == "3"
    assert extract_answer("so -2.5\n", "\n", "last_number") == "-2.5"
    assert extract_answer("no idea\n", "\n", "last_number") == ""
    assert extract_answer("7 or \\boxed{8}", "\n", "last_number") == "8"  # a boxed answer still wins


def test_last_number_answers_score_with_the_tasks_scorer(arithmetic, rg):
    env = ReasoningGymEnv("basic_arithmetic", size=200, seed=42, answer_format="last_number")
    assert env.new_episode(0).step("-5 * -6 = 30\n").success  # question 0 is "Calculate -5 * -6."
    assert not arithmetic.new_episode(0).step("-5 * -6 = 30\n").success  # the whole text is no number
    with pytest.raises(ValueError, match="env.answer_format"):
        ReasoningGymEnv("basic_arithmetic", size=20, answer_format="first_number")


def test_missing_extra_fails_at_once_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` now raises ImportError

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the extra was checked")

    monkeypatch.setattr(reasoning_gym_adapter, "GlobalRandomState", no_work)
    with pytest.raises(
        ImportError, match=r"env=reasoning_gym needs the 'reasoning-gym' extra: pip install -e \"\.\[reasoning-gym\]\""
    ):
        ReasoningGymEnv()


def test_hydra_config_lists_every_argument_with_its_default():
    from lit_asyncrl.config_dir import config_dir

    config = OmegaConf.to_container(OmegaConf.load(f"{config_dir()}/env/reasoning_gym.yaml"))
    assert (
        config.pop("_target_") == "lit_asyncrl.envs.adapters.reasoning_gym.ReasoningGymEnv"
    )  # a module path: lit_asyncrl.envs imports without the extra
    signature = inspect.signature(reasoning_gym_adapter.ReasoningGymEnv)
    assert config == {key: parameter.default for key, parameter in signature.parameters.items()}


def test_copies_and_pickles(rg):
    env = reasoning_gym_adapter.ReasoningGymEnv()
    for clone in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        episode = clone.new_episode(training_instance(clone, random.Random(0)))
        assert episode.reset() == env.new_episode(training_instance(env, random.Random(0))).reset()
