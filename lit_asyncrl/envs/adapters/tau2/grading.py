"""An episode of a tau2 task as tau2's own messages, scored by tau2's evaluator.

tau2 grades a conversation by replaying its tool calls on a fresh copy of the domain's databases and
comparing with the expected actions' result (`DB`), and by looking for the facts the agent had to tell
the user in its messages (`COMMUNICATE`); a conversation that the user did not end scores 0, as in
tau2's own runs (`MAX_STEPS`). Only the calls that reached tau2's environment are replayed: a call this
library refused (an unknown tool, arguments that do not match the schema, an unreadable call) never
changed anything, and tau2 would answer it otherwise.
"""

from __future__ import annotations

import uuid
from typing import Any

from lit_asyncrl.envs.adapters.tau2.domain import Tau2Domain


def tau2_messages(transcript: list[dict[str, Any]], executed: list[tuple[Any, Any]]) -> list[Any]:
    """`transcript` (the episode's OpenAI-style messages) as tau2 messages, with the calls of `executed`
    (each call that reached tau2, with tau2's answer, in order) where the agent made them."""
    from tau2.data_model.message import AssistantMessage, UserMessage

    messages = []
    pending = list(executed)
    for message in transcript:
        if message["role"] == "user":
            messages.append(UserMessage(role="user", content=message["content"]))
        elif message["role"] == "assistant" and message.get("tool_calls"):
            # tau2's agents either talk or call, never both in one message: a call turn's text is not talk.
            for call in message["tool_calls"]:
                if pending and pending[0][0].name == call["function"]["name"]:
                    tool_call, answer = pending.pop(0)
                    messages += [AssistantMessage(role="assistant", tool_calls=[tool_call]), answer]
        elif message["role"] == "assistant" and message["content"].strip():
            messages.append(AssistantMessage(role="assistant", content=message["content"]))
    return messages


def evaluate(domain: Tau2Domain, task_id: str, messages: list[Any], user_ended: bool) -> Any:
    """tau2's `RewardInfo` for a conversation of task `task_id` (its `reward`, and the checks behind it)."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.utils.utils import get_now

    now = get_now()
    run = SimulationRun(
        id=str(uuid.uuid4()),
        task_id=task_id,
        start_time=now,
        end_time=now,
        duration=0.0,
        termination_reason=TerminationReason.USER_STOP if user_ended else TerminationReason.MAX_STEPS,
        messages=messages,
    )
    return evaluate_simulation(
        simulation=run,
        task=domain.tasks[task_id],
        evaluation_type=EvaluationType.ALL,
        solo_mode=False,
        domain=domain.name,
    )


def failed_checks(reward_info: Any) -> str:
    """Why a conversation did not score 1, in words (the database, each fact not told, each assertion)."""
    reasons = []
    if reward_info.db_check is not None and not reward_info.db_check.db_match:
        reasons.append("the database differs from the expected one")
    reasons += [f"not told: {check.info!r}" for check in reward_info.communicate_checks or [] if not check.met]
    reasons += [
        f"assertion failed: {check.env_assertion.func_name}"
        for check in reward_info.env_assertions or []
        if not check.met
    ]
    reasons += [
        f"action not taken: {check.action.name}" for check in reward_info.action_checks or [] if not check.action_match
    ]
    return "; ".join(reasons) or f"reward {reward_info.reward}"
