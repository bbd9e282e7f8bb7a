"""A dataset task's reward functions: TRL's calling convention, built-ins, weights, None and failures."""

import re

import pytest

from lit_asyncrl.envs.dataset_task.math_answers import MathVerifier
from lit_asyncrl.envs.dataset_task.rewards import reward_terms, score_blocking

EXAMPLES = "tests.support.reward_functions"


@pytest.fixture(scope="module")
def verifier():
    verifier = MathVerifier()
    yield verifier
    verifier.close()


def terms(names, verifier, weights=None, answer_key="answer"):
    return reward_terms(names, weights, answer_key, verifier)


def test_trls_documented_reward_functions_run_unchanged(verifier):
    chosen = terms([f"{EXAMPLES}.reward_len", f"{EXAMPLES}.reward_func"], verifier)
    scores = score_blocking(chosen, "What is 6*7?", "so \\boxed{42}", {"ground_truth": "42"})
    # len("so \\boxed{42}") = 13 -> -|20 - 13| = -7; the boxed 42 matches: 1.0.
    assert scores.values == {f"{EXAMPLES}.reward_len": -7.0, f"{EXAMPLES}.reward_func": 1.0}
    assert scores.reward == -6.0 and scores.failed == ()


def test_weights_none_and_failures_by_hand(verifier):
    chosen = terms(
        ["exact_match", f"{EXAMPLES}.async_has_digit", f"{EXAMPLES}.only_short", f"{EXAMPLES}.broken"],
        verifier,
        weights=[2.0, 0.5, 3.0, 10.0],
    )
    short = score_blocking(chosen, "p", " 12 ", {"answer": "12"})
    # exact 1.0 * 2 + digit 1.0 * 0.5 + short 1.0 * 3; broken raised: left out and named.
    assert short.reward == 5.5
    assert short.values[f"{EXAMPLES}.broken"] is None and short.failed == (f"{EXAMPLES}.broken",)
    long = score_blocking(chosen, "p", "twelve!", {"answer": "12"})
    # exact 0, no digit 0, only_short says None (skipped), broken fails: 0.
    assert long.reward == 0.0
    assert long.values == {
        "exact_match": 0.0,
        f"{EXAMPLES}.async_has_digit": 0.0,
        f"{EXAMPLES}.only_short": None,
        f"{EXAMPLES}.broken": None,
    }


@pytest.mark.parametrize(
    ("completion", "gold", "right"),
    [("The answer is $\\frac{1}{2}$", "0.5", True), ("so 41", "42", False), ("no number here", "42", False)],
)
def test_math_verify_on_hand_written_answers(verifier, completion, gold, right):
    scores = score_blocking(terms(["math_verify"], verifier), "p", completion, {"answer": gold})
    assert scores.values == {"math_verify": float(right)} and scores.failed == ()


def test_math_verify_works_off_the_main_thread(verifier):
    # The task's steps run in a thread pool; math-verify's alarm needs a main thread: its worker's.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        scores = pool.submit(score_blocking, terms(["math_verify"], verifier), "p", "x = 4", {"answer": "4"}).result()
    assert scores.values == {"math_verify": 1.0}


@pytest.mark.parametrize(
    ("names", "weights", "message"),
    [
        ([], None, "env.rewards: name at least one"),
        (["exact_match"], [1.0, 2.0], "env.reward_weights has 2 weights for 1 env.rewards"),
        (["exact"], None, "'exact' is neither a built-in"),
        (["no_such_module.f"], None, "cannot import 'no_such_module.f'"),
        ([f"{EXAMPLES}.NOT_CALLABLE"], None, "is not callable"),
        ([f"{EXAMPLES}.no_completions"], None, "takes neither `completions` nor **kwargs"),
    ],
)
def test_bad_reward_settings_are_refused_naming_the_key(verifier, names, weights, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        terms(names, verifier, weights)
