"""Ground-truth replay: every task's expected actions played through the adapter, graded by tau2.

A user's first check that the benchmark is installed and the adapter is sound: each task is opened as a
run opens it (the greeting, then a scripted user's request), the task's expected calls are made by the
agent one turn each through the adapter's tools, a last agent message tells the user every fact the task
asks to be told, the user ends the conversation, and tau2's evaluator grades it. A task whose expected
actions include the user's own (tau2's telecom users act on their phone) cannot be replayed so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Sequence

from lit_asyncrl.envs.adapters.tau2.grading import evaluate, failed_checks, tau2_messages
from lit_asyncrl.envs.adapters.tau2.task import Tau2Env
from lit_asyncrl.envs.tools import AssistantTurn, ToolCall
from lit_asyncrl.envs.users.simulated import ScriptedUser

#: Turns enough for the longest expected play (one turn per call, and the last message).
REPLAY_TURNS = 64


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """One task's replay: its reward from tau2's evaluator and, below 1, why."""

    task_id: str
    reward: float
    reason: str | None = None


def ground_truth_turns(env: Tau2Env, task_id: str) -> list[AssistantTurn]:
    """The agent's turns of a perfect play: each expected call, then every fact to tell in one message."""
    criteria = env.domain.tasks[task_id].evaluation_criteria
    actions = criteria.actions or []
    turns = [AssistantTurn("", (ToolCall(action.name, dict(action.arguments)),)) for action in actions]
    facts = criteria.communicate_info or []
    turns.append(AssistantTurn("Here is what you asked: " + "; ".join(facts) if facts else "Your request is done."))
    return turns


def replay_task(env: Tau2Env, task_id: str) -> ReplayResult:
    """Play the task's ground truth through an episode of `env` (its user must be a `ScriptedUser`)."""
    actions = env.domain.tasks[task_id].evaluation_criteria.actions or []
    users = sorted({action.name for action in actions if action.requestor == "user"})
    if users:
        return ReplayResult(task_id, 0.0, f"its expected actions include the user's own ({', '.join(users)})")
    return play_turns(env, task_id, ground_truth_turns(env, task_id))


def play_turns(env: Tau2Env, task_id: str, turns: Sequence[AssistantTurn]) -> ReplayResult:
    """Play the agent's `turns` through an episode of task `task_id`, graded by tau2 (with the reason below 1)."""
    episode = env.new_episode(task_id)

    async def play() -> tuple[float, bool]:
        """The play's reward, and whether the user ended it (the only way a tau2 episode terminates)."""
        opening = episode.reset()
        if inspect.isawaitable(opening):
            await opening
        reward = 0.0
        for turn in turns:
            transition = await episode.step(turn)
            reward += transition.reward
            if transition.done:
                return reward, transition.terminated
        return reward, False

    reward, user_ended = asyncio.run(play())
    if reward == 1.0:
        return ReplayResult(task_id, reward)
    reward_info = evaluate(env.domain, task_id, tau2_messages(episode.transcript, episode.state.executed), user_ended)
    return ReplayResult(task_id, reward, failed_checks(reward_info))


def replay_domain(domain: str, split: str, task_ids: Sequence[str] | None = None) -> list[ReplayResult]:
    """Replay the tasks of `split` (`train`, `test` or `all`; or the ones named) of `domain`."""
    env = Tau2Env(domain, user=ScriptedUser(), max_turns=REPLAY_TURNS)
    if task_ids is None:
        task_ids = {
            "train": env.domain.train_ids,
            "test": env.domain.test_ids,
            "all": [*env.domain.train_ids, *env.domain.test_ids],
        }[split]
    unknown = [task_id for task_id in task_ids if task_id not in env.domain.tasks]
    if unknown:
        raise ValueError(f"--tasks: no such task in {domain}: {', '.join(unknown)}")
    return [replay_task(env, task_id) for task_id in task_ids]
