"""The dataset task on hand-made files: formats, columns, held-out rows, one episode scored."""

import json
import random
import re

import pytest

from lit_asyncrl.envs.dataset_task.task import DatasetEnv
from lit_asyncrl.rollout.serving.instances import TrainingDraws, held_out_instances

ROWS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "split": "test" if a % 4 == 0 else "train"} for a in range(12)]


def write(folder, rows, suffix):
    import datasets

    path = folder / f"rows{suffix}"
    table = datasets.Dataset.from_list(rows)
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".parquet":
        table.to_parquet(str(path))
    elif suffix == ".csv":
        table.to_csv(str(path), index=False)
    else:
        table.save_to_disk(str(path))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv", "_saved"])
def test_each_format_gives_the_same_rows_and_an_episode_scores_its_answer(tmp_path, suffix):
    env = DatasetEnv(str(write(tmp_path, ROWS, suffix)), split_key="split")
    assert [row["prompt"] for row in env.rows] == [row["prompt"] for row in ROWS]
    assert sorted(env.held_out_rows) == [0, 4, 8]
    episode = env.new_episode(3)
    assert episode.reset() == "3+3="
    right = episode.step("6")
    assert (right.reward, right.done, right.success) == (1.0, True, True)
    assert right.info["rewards"] == {"exact_match": 1.0} and right.info["reward_failures"] == []
    assert env.new_episode(3).step("7").reward == 0.0
    env.close()


def test_training_rows_come_in_epochs_and_the_held_out_set_is_all_of_the_others(tmp_path):
    env = DatasetEnv(str(write(tmp_path, ROWS, ".jsonl")), split_key="split")
    assert env.training_instances() == [1, 2, 3, 5, 6, 7, 9, 10, 11]
    draws = TrainingDraws(env, seed=0)
    rng = random.Random(0)
    epochs = [[draws.draw(rng, {}) for _ in range(9)] for _ in range(3)]
    assert all(sorted(epoch) == env.training_instances() for epoch in epochs)
    assert sorted(held_out_instances(env, 64)) == [0, 4, 8]


def test_a_second_file_holds_the_held_out_rows(tmp_path):
    train = write(tmp_path, ROWS[:8], ".jsonl")
    (tmp_path / "eval").mkdir()
    held = write(tmp_path / "eval", ROWS[8:], ".csv")
    env = DatasetEnv(str(train), eval_path=str(held))
    assert sorted(env.held_out_rows) == [8, 9, 10, 11] and len(env.rows) == 12


def test_without_a_split_a_stable_hash_of_the_prompt_holds_rows_out(tmp_path):
    rows = [{"prompt": f"q{index}", "answer": "a"} for index in range(200)]
    first = DatasetEnv(str(write(tmp_path, rows, ".jsonl")), held_out_fraction=0.25)
    second = DatasetEnv(str(tmp_path / "rows.jsonl"), held_out_fraction=0.25)
    assert first.held_out_rows == second.held_out_rows
    assert 30 <= len(first.held_out_rows) <= 70  # a quarter of 200, within 3.6 standard deviations


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"path": "/no/such/file.jsonl"}, "env.path=/no/such/file.jsonl: no such file or folder"),
        ({"prompt_key": "question"}, "env.prompt_key='question': "),
        ({"answer_key": "solution"}, "env.answer_key='solution': "),
        ({"split_key": "fold"}, "env.split_key='fold': "),
        ({"rewards": ["nope"]}, "env.rewards: 'nope' is neither a built-in"),
    ],
)
def test_bad_settings_are_refused_before_any_engine_naming_the_key(tmp_path, settings, message):
    path = str(write(tmp_path, ROWS, ".jsonl"))
    with pytest.raises((ValueError, FileNotFoundError), match=re.escape(message)):
        DatasetEnv(**({"path": path} | settings))


def test_a_solution_column_gives_the_warm_starts_demonstrations(tmp_path):
    rows = [dict(row, worked=f"{row['answer']}") for row in ROWS]
    env = DatasetEnv(str(write(tmp_path, rows, ".jsonl")), split_key="split", solution_key="worked")
    assert env.demonstration(5) == [("10\n", "")]
    assert env.new_episode(5).step(env.demonstration(5)[0][0]).success  # the demonstration wins its own row
    without = DatasetEnv(str(tmp_path / "rows.jsonl"), split_key="split")
    with pytest.raises(NotImplementedError, match="env.solution_key"):
        without.demonstration(5)
    with pytest.raises(ValueError, match=re.escape("env.solution_key='steps': ")):
        DatasetEnv(str(tmp_path / "rows.jsonl"), solution_key="steps")
