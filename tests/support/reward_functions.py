"""Reward functions the dataset task's tests name by dotted path (`env.rewards`), in-process and in real runs."""

import asyncio
import re


def reward_len(completions, **kwargs):
    """TRL's documented example, copied as it is: prefer completions close to 20 characters."""
    return [-abs(20 - len(completion)) for completion in completions]


def reward_func(completions, ground_truth, **kwargs):
    """TRL's documented example, copied as it is: the boxed answer against the ground_truth column."""
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


async def async_has_digit(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(any(character.isdigit() for character in text)) for text in completions]


def only_short(completions, **kwargs):
    """Scores completions under 5 characters; says nothing (None) about the others."""
    return [1.0 if len(text) < 5 else None for text in completions]


def broken(completions, **kwargs):
    raise RuntimeError("a reward function with a bug")


def no_completions(prompts):
    return [0.0 for _ in prompts]


NOT_CALLABLE = 3


def answer_column_reached(completions, answer, **kwargs):
    """1.0 for every completion whose row's `answer` column arrived (by its name) as a string of digits."""
    return [1.0 if str(value).isdigit() else 0.0 for value in answer]


def format_reward_func(completions, **kwargs):
    """TRL's documented example for conversational prompts, copied as it is."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]
