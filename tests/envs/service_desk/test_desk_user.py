"""The service desk with a simulated customer: the `ask` tool, the cooperative user, the scripted
solver, the user's answers as one line, and the roles a chat model sees."""

from __future__ import annotations

import asyncio
import random

import pytest

from lit_asyncrl.envs import CooperativeUser, ServiceDeskEnv, SimulatedUser
from lit_asyncrl.envs.base import call_blocking
from lit_asyncrl.envs.service_desk.agent import ScriptedAgent
from lit_asyncrl.envs.service_desk.orders import DIFFICULTIES, CustomerGoal, DeskInstance, Order
from lit_asyncrl.envs.users.simulated import Message
from lit_asyncrl.models.char_tokenizer import CHARACTERS
from lit_asyncrl.rollout.serving.instances import held_out_instances, training_instance


class ScriptedUser(SimulatedUser):
    """Answers with the next of `answers` and records what it was asked."""

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.calls, self.started, self.closed = list(answers), [], 0, 0
        self.engine_makers: list = []

    def start(self, make_engine=None) -> None:
        self.started += 1
        self.engine_makers.append(make_engine)

    def close(self) -> None:
        self.closed += 1

    async def reply(self, goal, conversation):
        self.calls.append((goal, list(conversation)))
        return self.answers.pop(0)


def desk(request="refund", order_id=42, status="delivered", days=12):
    orders = (Order(17, "pen", "placed", 2), Order(order_id, "mug", status, days))
    return DeskInstance(orders=orders, request=request, order_id=order_id)


def play(env, instance, actions):
    episode = env.new_episode(instance)
    return episode.reset(), [call_blocking(episode.step, action) for action in actions]


def test_the_customer_names_the_item_and_gives_the_id_when_asked():
    env = ServiceDeskEnv(user=CooperativeUser(), max_turns=5)
    prompt, results = play(env, desk(), ["ask hello\n", "ask id\n", "look 42\n", "refund 42\n", "reply done\n"])
    assert prompt == "user: refund mug\n"
    assert [r.observation for r in results] == [
        "user: refund mug\n",
        "user: 42\n",
        "42 mug delivered 12d\n",
        "ok\n",
        "",
    ]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert [r.done for r in results] == [False, False, False, False, True] and results[-1].success


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("What is your order number?", "42"),
        ("which one", "42"),
        ("ID?", "42"),
        ("hello", "refund mug"),
        ("idea", "refund mug"),
    ],
)
def test_the_cooperative_answer_is_the_id_only_when_asked_for_it(question, answer):
    assert CustomerGoal("refund", "mug", 42).answer(question) == answer


def test_the_goal_in_words_names_what_the_customer_wants_and_knows():
    assert CustomerGoal("where", "hat", 7).instructions.startswith(
        "You are a customer writing to an online shop's service desk. You want to know where your hat is; its order number is 7."
    )
    assert "You want to cancel your cup; its order number is 55." in CustomerGoal("cancel", "cup", 55).instructions


def test_without_a_user_ask_is_a_malformed_call():
    _, (result,) = play(ServiceDeskEnv(), desk(), ["ask id\n"])
    assert result == ("err\n", -0.1, False, False, {"malformed": True})


def test_the_user_gets_the_goal_and_the_conversation_and_its_answer_is_one_printable_line():
    user = ScriptedUser(["Sure!\tIt's 42\nand more", "caf\u00e9 " + "x" * 200, "  \n"])
    env = ServiceDeskEnv(user=user, max_turns=6)
    _, results = play(env, desk(), ["ask What is your order number?\n", "ask again\n", "ask once more\n"])
    assert [r.observation for r in results] == ["user: Sure! It's 42\n", "user: caf  " + "x" * 75 + "\n", "user: ...\n"]
    goal, conversation = user.calls[1]
    assert goal == CustomerGoal("refund", "mug", 42)
    assert conversation == [
        Message("user", "refund mug"),
        Message("agent", "What is your order number?"),
        Message("user", "Sure! It's 42"),
        Message("agent", "again"),
    ]


def test_asking_counts_as_a_turn_and_the_limit_truncates():
    env = ServiceDeskEnv(user=CooperativeUser(), max_turns=4)
    _, results = play(env, desk(), ["ask id\n"] * 4)
    assert [(r.terminated, r.truncated) for r in results] == [(False, False)] * 3 + [(False, True)]


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_the_scripted_agent_asks_then_solves_training_and_held_out_instances(difficulty):
    env, rng = ServiceDeskEnv(difficulty=difficulty, user=CooperativeUser(), max_turns=5), random.Random(0)
    instances = [training_instance(env, rng) for _ in range(300)] + held_out_instances(env, 100, seed=1)
    for instance in instances:
        items = [order.item for order in instance.orders]
        assert len(set(items)) == len(items)  # the item names one order
        agent, episode = ScriptedAgent(env.refund_window_days), env.new_episode(instance)
        observation, actions = episode.reset(), []
        for _ in range(env.max_turns):
            actions.append(agent.act(observation))
            result = call_blocking(episode.step, actions[-1])
            if result.done:
                break
            observation = result.observation
        assert result.success and actions[0] == "ask id\n", env.instance_key(instance)
        demonstration = env.demonstration(instance)
        assert [action for action, _ in demonstration] == actions and 3 <= len(actions) <= 4
        texts = [episode.reset(), *(text for turn in demonstration for text in turn)]
        assert set("".join(texts)) <= set(CHARACTERS)


def test_demonstrations_show_the_cooperative_customer_whatever_the_user():
    user = ScriptedUser([])  # would fail if asked
    env = ServiceDeskEnv(user=user, max_turns=5)
    assert env.demonstration(desk()) == [
        ("ask id\n", "user: 42\n"),
        ("look 42\n", "42 mug delivered 12d\n"),
        ("refund 42\n", "ok\n"),
        ("reply done\n", ""),
    ]
    assert user.calls == []


def test_answers_of_the_user_and_of_the_tools_have_their_own_roles():
    with_user, without = ServiceDeskEnv(user=CooperativeUser()), ServiceDeskEnv()
    assert [with_user.observation_role_of(text) for text in ("user: 42\n", "42 mug delivered 12d\n", "ok\n")] == [
        "user",
        "tool",
        "tool",
    ]
    assert without.observation_role_of("user: 42\n") == "tool"
    assert "`ask QUESTION`" in with_user.system_prompt and "ask" not in without.system_prompt


def test_the_environment_starts_and_closes_its_user():
    user = ScriptedUser([])
    env = ServiceDeskEnv(user=user)
    env.start(make_engine := object())
    env.close()
    assert (user.started, user.closed) == (1, 1)
    assert user.engine_makers == [make_engine]  # the runner's engine maker reaches the user
    ServiceDeskEnv().start()  # no user: nothing to start


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"user": CooperativeUser(), "max_turns": 3}, r"env.max_turns must be >= 4 \(ask, look, act, reply\)"),
        ({"user": "yes"}, "env.user"),
    ],
)
def test_bad_user_settings_name_the_key(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ServiceDeskEnv(**kwargs)


def test_the_cooperative_user_needs_the_agents_message_last():
    with pytest.raises(ValueError, match="must end with the agent's message"):
        asyncio.run(CooperativeUser().reply(CustomerGoal("refund", "mug", 42), [Message("user", "refund mug")]))


def test_a_chat_model_sees_the_users_answer_as_a_user_message_and_the_tools_as_tool_messages():
    from lit_asyncrl.rollout.episodes.formats import ChatTemplateFormat
    from lit_asyncrl.rollout.records import Trajectory
    from tests.support.chat_templates import CHATML, chat_tokenizer

    env = ServiceDeskEnv(user=CooperativeUser())
    tokenizer = chat_tokenizer(CHATML)
    chat_format, trajectory = ChatTemplateFormat(tokenizer, env), Trajectory(group_id=0)
    chat_format.open(trajectory, "user: refund mug\n")
    for action, answer in [("ask id", "user: 42\n"), ("look 42", "42 mug delivered 12d\n")]:
        action_ids = tokenizer.encode(action + "<|im_end|>", add_special_tokens=False)
        trajectory.extend_policy(action_ids, [0.0] * len(action_ids), [0] * len(action_ids))
        chat_format.add_observation(trajectory, answer)
    assert tokenizer.decode(trajectory.token_ids) == (
        f"<|im_start|>system\n{env.system_prompt}<|im_end|>\n<|im_start|>user\nuser: refund mug\n<|im_end|>\n"
        "<|im_start|>assistant\nask id<|im_end|>\n<|im_start|>user\nuser: 42\n<|im_end|>\n"
        "<|im_start|>assistant\nlook 42<|im_end|>\n<|im_start|>tool\n42 mug delivered 12d\n<|im_end|>\n<|im_start|>assistant\n"
    )
