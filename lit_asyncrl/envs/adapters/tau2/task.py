"""`Tau2Env`: a tau2 domain's tasks as a conversational tool task (see the package's docstring)."""

from __future__ import annotations

import random
import threading
from typing import Any, NamedTuple

from lit_asyncrl.envs.adapters.tau2.domain import GREETING, Tau2Domain, load_domain
from lit_asyncrl.envs.adapters.tau2.grading import evaluate, tau2_messages
from lit_asyncrl.envs.tools import Ending, Grade, Tool, ToolEnv
from lit_asyncrl.envs.tools.endings import USER_ENDED
from lit_asyncrl.envs.users.simulated import SimulatedUser


class Tau2Goal(NamedTuple):
    """What the user of one tau2 task wants: tau2's user prompt (guidelines and the task's scenario) for a
    user played by a model, and the task's reason for calling as the script of a scripted user."""

    instructions: str
    script: tuple[str, ...]

    def answer(self, question: str) -> str:
        return self.script[0]


class Tau2State:
    """One episode's copy of the domain's databases (made at the first call, in the episode's worker
    thread: airline's takes half a second to load) and every call that reached it, with tau2's answer."""

    def __init__(self, domain: Tau2Domain, task_id: str) -> None:
        self.domain = domain
        self.task_id = task_id
        self.executed: list[tuple[Any, Any]] = []
        self._environment: Any = None
        self._lock = threading.Lock()

    def environment(self) -> Any:
        with self._lock:
            if self._environment is None:
                environment = self.domain.make_environment()
                initial = self.domain.tasks[self.task_id].initial_state
                environment.set_state(
                    initialization_data=initial.initialization_data if initial else None,
                    initialization_actions=initial.initialization_actions if initial else None,
                    message_history=[],
                )
                self._environment = environment
            return self._environment

    def call(self, tool_name: str, /, **arguments: Any) -> str:
        """Run a tool through tau2 (`get_response`): its answer as tau2's agents read it, an error included."""
        from tau2.data_model.message import ToolCall

        tool_call = ToolCall(id=f"call_{len(self.executed)}", name=tool_name, arguments=arguments)
        answer = self.environment().get_response(tool_call)
        self.executed.append((tool_call, answer))
        return answer.content


class _Tau2Tool:
    """A tau2 tool of one episode (a named callable: the episode runs it in a thread)."""

    def __init__(self, state: Tau2State, name: str) -> None:
        self.state = state
        self.name = name

    def __call__(self, **arguments: Any) -> str:
        return self.state.call(self.name, **arguments)


class Tau2Env(ToolEnv):
    """tau2-bench's domain `domain`: its tasks, tools, policy, simulated user and evaluator.

    The agent is told tau2's agent instructions and the domain's policy (the system message), is shown
    the domain's tools, and greets the user as tau2's agents do; the user's answer opens the request.
    The reward is tau2's own for the task's reward basis (1 when solved, else 0); a conversation the run
    cut off scores 0 as in tau2. tau2's train split is trained on and its test split is held out (a
    domain without a split, `mock`, is split by `held_out_fraction`). Tasks the adapter cannot grade or
    open (an LLM judge's assertions, a recorded opening conversation) are left out and listed in
    `domain.skipped`.

    Args:
        domain: `retail`, `airline` or `mock` (telecom's users run tools on their phone; these do not).
        user: who plays the customer: `LLMUser` (a frozen model on an engine of its own, told tau2's user
            prompt; `end_markers` tau2's `###STOP###`, `###TRANSFER###`, `###OUT-OF-SCOPE###`) or
            `ScriptedUser` (the task's reason for calling, then the end: what the replay uses).
        max_turn_tokens: most tokens of one agent turn (a booking call is long).
        held_out_fraction: for a domain without tau2's split.
        tool_parser, tool_timeout_s, call_error_reward, max_turns, arguments, latency_s, episode_timeout_s:
            see `ToolEnv`.
    """

    grades_cut_offs = True  # tau2 scores a conversation the user did not end 0 (MAX_STEPS), and says so

    def __init__(
        self,
        domain: str = "retail",
        user: SimulatedUser | None = None,
        max_turns: int = 30,
        max_turn_tokens: int = 256,
        held_out_fraction: float = 0.2,
        tool_parser: str = "hermes",
        tool_timeout_s: float = 30.0,
        call_error_reward: float = 0.0,
        arguments: str = "strict",
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        if not isinstance(user, SimulatedUser):
            raise ValueError(
                "env.user must be a SimulatedUser (tau2's tasks are conversations), e.g. "
                f"lit_asyncrl.envs.LLMUser or lit_asyncrl.envs.ScriptedUser; got {user!r}"
            )
        if isinstance(max_turn_tokens, bool) or not isinstance(max_turn_tokens, int) or max_turn_tokens < 1:
            raise ValueError(f"env.max_turn_tokens must be an integer >= 1, got {max_turn_tokens!r}")
        super().__init__(
            tool_parser=tool_parser,
            tool_timeout_s=tool_timeout_s,
            call_error_reward=call_error_reward,
            max_turns=max_turns,
            arguments=arguments,
            user=user,
            latency_s=latency_s,
            episode_timeout_s=episode_timeout_s,
        )
        self.domain_name = domain
        self.max_turn_tokens = max_turn_tokens
        self.held_out_fraction = held_out_fraction
        self.domain = load_domain(domain)
        self._test_ids = frozenset(self.domain.test_ids)

    def generate_instance(self, rng: random.Random) -> str:
        return rng.choice(sorted(self.domain.tasks))

    def instance_key(self, instance: str) -> str:
        return instance

    def is_held_out(self, instance: str) -> bool:
        if self.domain.test_ids:
            return instance in self._test_ids
        return super().is_held_out(instance)

    def training_instances(self) -> list[str]:
        return [task_id for task_id in self.domain.train_ids if not self.is_held_out(task_id)]

    def new_state(self, instance: str) -> Tau2State:
        return Tau2State(self.domain, instance)

    def tools(self, state: Tau2State) -> list[Tool]:
        return [Tool(schema, _Tau2Tool(state, schema["function"]["name"])) for schema in self.domain.tool_schemas]

    def opening(self, instance: str) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": self.domain.agent_system_prompt()},
            {"role": "assistant", "content": GREETING},
        ]

    def user_goal(self, state: Tau2State) -> Tau2Goal:
        return Tau2Goal(self.domain.user_system_prompt(state.task_id), (self.domain.first_request(state.task_id),))

    def grade(self, ending: Ending) -> Grade:
        messages = tau2_messages(ending.transcript, ending.state.executed)
        reward_info = evaluate(self.domain, ending.instance, messages, user_ended=ending.reason == USER_ENDED)
        reward = float(reward_info.reward)
        return Grade(reward, reward == 1.0)
