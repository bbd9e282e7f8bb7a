"""The example dataset script writes distinct word problems whose answers are right, the same file for a
seed, the held-out rows it was asked for, and a file the dataset task reads."""

import json
import operator
import re

import pytest

from lit_asyncrl.envs.dataset_task.task import DatasetEnv
from lit_asyncrl.examples.word_problems import main, word_problems

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def test_every_problem_is_distinct_and_its_answer_is_the_arithmetic_of_its_numbers():
    rows = word_problems(rows=300, held_out=64, seed=0)
    assert len({row["prompt"] for row in rows}) == 300
    for row in rows:
        a, sign, b, answer = re.fullmatch(r"(\d+) ([-+*]) (\d+) = (\d+)", row["solution"]).groups()
        assert OPERATORS[sign](int(a), int(b)) == int(answer) == int(row["answer"]) >= 0
        # The problem states both numbers, in the solution's order.
        assert re.findall(r"\d+", row["prompt"]) == [a, b]
    assert [row["split"] for row in rows] == ["train"] * 236 + ["test"] * 64


def test_the_seed_fixes_the_file(tmp_path):
    paths = [tmp_path / name for name in ("a.jsonl", "b.jsonl", "c.jsonl")]
    for path, seed in zip(paths, (3, 3, 4)):
        main([str(path), "--rows", "50", "--held-out", "10", "--seed", str(seed)])
    assert paths[0].read_text() == paths[1].read_text() != paths[2].read_text()


def test_the_dataset_task_reads_the_file_with_its_held_out_rows(tmp_path):
    path = tmp_path / "data" / "problems.jsonl"  # the folder is made
    main([str(path), "--rows", "40", "--held-out", "8"])
    env = DatasetEnv(str(path), split_key="split", rewards=["math_verify"], solution_key="solution")
    try:
        assert len(env.rows) == 40 and len(env.held_out_rows) == 8
        row = json.loads(path.read_text().splitlines()[0])
        assert env.demonstration(0) == [(f"{row['solution']}\n", "")]
        right = env.new_episode(0).step(f"The answer is {row['answer']}.")
        wrong = env.new_episode(0).step(f"The answer is {int(row['answer']) + 1}.")
        assert (right.reward, wrong.reward) == (1.0, 0.0)
    finally:
        env.close()


@pytest.mark.parametrize("held_out", [0, 50])
def test_a_held_out_count_outside_the_rows_is_refused(held_out):
    with pytest.raises(ValueError, match=r"--held-out must be between 1 and --rows - 1 \(49\)"):
        word_problems(rows=50, held_out=held_out, seed=0)
