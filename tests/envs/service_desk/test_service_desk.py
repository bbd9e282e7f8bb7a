"""The tool-use service-desk task: tools, rules, rewards, the scripted solver, baselines and splits."""

import inspect
import random
from pathlib import Path

import pytest
import yaml

from lit_asyncrl.envs.service_desk.agent import ScriptedAgent
from lit_asyncrl.envs.service_desk.orders import DIFFICULTIES, DeskInstance, Order
from lit_asyncrl.envs.service_desk.task import ServiceDeskEnv
from lit_asyncrl.models.char_tokenizer import CHARACTERS
from lit_asyncrl.rollout.serving.instances import held_out_instances, training_instance

CONFIG = Path(__file__).resolve().parents[3] / "conf" / "env" / "service_desk.yaml"


def desk(request, order_id=42, status="delivered", days=12):
    """An instance with the requested order and one other (placed) order, 17."""
    orders = tuple(
        sorted([Order(order_id, "mug", status, days), Order(17, "pen", "placed", 2)], key=lambda o: o.order_id)
    )
    return DeskInstance(orders=orders, request=request, order_id=order_id)


def play(env, instance, actions):
    """Step `actions` into a fresh episode; returns the prompt and every transition."""
    episode = env.new_episode(instance)
    return episode.reset(), [episode.step(action) for action in actions]


def test_refund_within_the_window_step_by_step():
    prompt, (look, refund, reply) = play(ServiceDeskEnv(), desk("refund"), ["look 42\n", "refund 42\n", "reply done\n"])
    assert prompt == "user: refund 42\n"
    assert look == ("42 mug delivered 12d\n", 0.0, False, False, {})
    assert refund == ("ok\n", 0.0, False, False, {})
    assert reply == ("", 1.0, True, False, {"success": True})


@pytest.mark.parametrize(
    ("instance", "actions", "reward"),
    [
        # Refunds: delivered and at most refund_window_days (30) after delivery, the edge included.
        (desk("refund", days=30), ["look 42\n", "refund 42\n", "reply done\n"], 1.0),
        (desk("refund", days=31), ["look 42\n", "refund 42\n", "reply done\n"], 0.0),
        (desk("refund", days=31), ["look 42\n", "reply no\n"], 1.0),
        (desk("refund", status="shipped", days=3), ["look 42\n", "refund 42\n", "reply done\n"], 0.0),
        (desk("refund", status="shipped", days=3), ["look 42\n", "reply no\n"], 1.0),
        (desk("refund", status="placed", days=1), ["reply no\n"], 1.0),  # right without looking: lucky, not wrong
        (desk("refund"), ["look 42\n", "reply no\n"], 0.0),  # a wrongful refusal
        (desk("refund"), ["look 42\n", "refund 42\n", "reply no\n"], 0.0),  # right action, wrong reply
        (desk("refund"), ["look 42\n", "reply done\n"], 0.0),  # says done, did nothing
        (desk("refund"), ["refund 17\n", "refund 42\n", "reply done\n"], 0.0),  # also refunded another order
        (desk("refund"), ["cancel 42\n", "refund 42\n", "reply done\n"], 1.0),  # the final database counts
        # Cancels: placed orders only.
        (desk("cancel", status="placed", days=2), ["look 42\n", "cancel 42\n", "reply done\n"], 1.0),
        (desk("cancel", status="shipped", days=2), ["look 42\n", "cancel 42\n", "reply done\n"], 0.0),
        (desk("cancel", status="shipped", days=2), ["look 42\n", "reply no\n"], 1.0),
        (desk("cancel", status="delivered", days=2), ["look 42\n", "refund 42\n", "reply done\n"], 0.0),
        # Status questions: the status word, nothing changed.
        (desk("where", status="shipped", days=4), ["look 42\n", "reply shipped\n"], 1.0),
        (desk("where", status="shipped", days=4), ["look 42\n", "reply no\n"], 0.0),
        (desk("where", status="placed", days=4), ["look 42\n", "cancel 42\n", "reply placed\n"], 0.0),
    ],
)
def test_reward_needs_the_right_database_and_reply(instance, actions, reward):
    _, results = play(ServiceDeskEnv(), instance, actions)
    assert [result.done for result in results] == [False] * (len(actions) - 1) + [True]
    assert (results[-1].reward, results[-1].success, results[-1].terminated) == (reward, reward == 1.0, True)


def test_the_window_is_a_setting():
    instance, actions = desk("refund", days=31), ["look 42\n", "refund 42\n", "reply done\n"]
    assert play(ServiceDeskEnv(refund_window_days=31), instance, actions)[1][-1].success
    assert not play(ServiceDeskEnv(refund_window_days=30), instance, actions)[1][-1].success


def test_look_shows_the_episode_database_and_episodes_share_nothing():
    env, instance = ServiceDeskEnv(), desk("refund")
    first, second = env.new_episode(instance), env.new_episode(instance)
    assert first.step("refund 42\n").observation == "ok\n"
    assert first.step("look 42\n").observation == "42 mug refunded 12d\n"
    assert first.step("cancel 17\n").observation == "ok\n"
    assert first.step("look 17\n").observation == "17 pen cancelled 2d\n"
    assert second.step("look 42\n").observation == "42 mug delivered 12d\n"
    assert second.step("look 17\n").observation == "17 pen placed 2d\n"
    assert instance == desk("refund")


@pytest.mark.parametrize(
    "action",
    [
        "",
        "look 42",
        "look 99\n",
        "look 042\n",
        "peek 42\n",
        "LOOK 42\n",
        "look  42\n",
        "look 42 \n",
        "look\n",
        "look 42\nlook 42\n",
    ]
    + [
        "reply maybe\n",
        "reply\n",
        "reply no",
        "reply done!\n",
        "refund\n",
        "cancel x\n",
        "\n",
        "~}|{\n",
        "reply no<eos>",
    ],
)
def test_malformed_call_answers_err_with_the_penalty_and_the_episode_goes_on(action):
    env, instance = ServiceDeskEnv(malformed_reward=-0.1), desk("refund")
    _, results = play(env, instance, [action, "look 42\n", "refund 42\n", "reply done\n"])
    assert results[0] == ("err\n", -0.1, False, False, {"malformed": True})
    assert results[-1].success
    assert sum(result.reward for result in results) == pytest.approx(0.9)


def test_the_turn_limit_truncates_without_success():
    env = ServiceDeskEnv(max_turns=3)
    _, results = play(env, desk("refund"), ["look 42\n", "refund 42\n", "look 42\n"])
    assert [(r.terminated, r.truncated) for r in results] == [(False, False), (False, False), (False, True)]
    assert not results[-1].success
    _, results = play(env, desk("refund"), ["look 42\n", "look 42\n", "junk\n"])
    assert results[-1] == ("err\n", -0.1, False, True, {"malformed": True})


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_the_scripted_agent_solves_training_and_held_out_instances(difficulty):
    env, rng = ServiceDeskEnv(difficulty=difficulty), random.Random(0)
    instances = [training_instance(env, rng) for _ in range(500)] + held_out_instances(env, 200, seed=1)
    for instance in instances:
        # The agent sees only the prompt and the tool answers, never the instance.
        agent, episode = ScriptedAgent(env.refund_window_days), env.new_episode(instance)
        observation, total = episode.reset(), 0.0
        for _ in range(env.max_turns):
            result = episode.step(agent.act(observation))
            total += result.reward
            if result.done:
                break
            observation = result.observation
        assert result.success and total == 1.0, env.instance_key(instance)
        # The demonstration is the play the desk's policy asks for, written out here from the
        # instance's hidden order (not from the environment's own record or policy code).
        assert env.demonstration(instance) == policy_play(instance, env.refund_window_days), env.instance_key(instance)


def policy_play(instance, refund_window_days):
    """The desk's policy by hand: look the order up; refund a delivered order within the window,
    cancel a placed one, say where any order is; otherwise reply no."""
    order = next(order for order in instance.orders if order.order_id == instance.order_id)
    look = (f"look {order.order_id}\n", f"{order.order_id} {order.item} {order.status} {order.days}d\n")
    if instance.request == "where":
        return [look, (f"reply {order.status}\n", "")]
    acts = (instance.request == "refund" and order.status == "delivered" and order.days <= refund_window_days) or (
        instance.request == "cancel" and order.status == "placed"
    )
    if acts:
        return [look, (f"{instance.request} {order.order_id}\n", "ok\n"), ("reply done\n", "")]
    return [look, ("reply no\n", "")]


def test_the_example_demonstration_and_the_hard_edge():
    assert ServiceDeskEnv().demonstration(desk("refund", days=30)) == [
        ("look 42\n", "42 mug delivered 30d\n"),
        ("refund 42\n", "ok\n"),
        ("reply done\n", ""),
    ]
    assert ServiceDeskEnv().demonstration(desk("where", status="cancelled")) == [
        ("look 42\n", "42 mug cancelled 12d\n"),
        ("reply cancelled\n", ""),
    ]
    # hard: delivered orders lie within 5 days of the window's edge (26..35 for a 30-day window)
    env, rng = ServiceDeskEnv(difficulty="hard"), random.Random(0)
    days = {o.days for _ in range(2000) for o in env.generate_instance(rng).orders if o.status == "delivered"}
    assert days == set(range(26, 36))


def success_rate(env, policy, episodes=4000, seed=0):
    """Share of successful episodes of `policy(instance, prompt, observations, rng) -> action` on training instances."""
    rng, wins = random.Random(seed), 0
    for _ in range(episodes):
        instance = training_instance(env, rng)
        episode = env.new_episode(instance)
        observations = [episode.reset()]
        for _ in range(env.max_turns):
            result = episode.step(policy(instance, observations, rng))
            if result.done:
                wins += result.success
                break
            observations.append(result.observation)
    return wins / episodes


@pytest.mark.parametrize(("difficulty", "status_only_rate"), [("easy", 0.6), ("medium", 0.8)])
def test_blind_and_status_only_policies_stay_at_their_baselines(difficulty, status_only_rate):
    env = ServiceDeskEnv(difficulty=difficulty)
    # Every refund or cancel request is an even draw between acting and refusing: ignoring the record wins half.
    always_refuse = lambda instance, observations, rng: "reply no\n"
    write = lambda instance: "cancel" if instance.request == "cancel" else "refund"
    always_act = lambda instance, observations, rng: (
        "reply done\n" if len(observations) > 1 else f"{write(instance)} {instance.order_id}\n"
    )
    assert 0.47 < success_rate(env, always_refuse) < 0.53
    assert 0.47 < success_rate(env, always_act) < 0.53

    # Reading the status but not the days: refunds 0.5 + 0.5 * 0.2 (refusals that are not delivered orders)
    # = 0.6 (all of easy), cancels all right, so 0.8 at medium; the rest is the number rule.
    def status_only(instance, observations, rng):
        if len(observations) == 1:
            return f"look {instance.order_id}\n"
        if observations[-1] == "ok\n":
            return "reply done\n"
        status = observations[-1].split()[2]
        acts = status == ("placed" if instance.request == "cancel" else "delivered")
        return f"{write(instance)} {instance.order_id}\n" if acts else "reply no\n"

    assert status_only_rate - 0.03 < success_rate(env, status_only) < status_only_rate + 0.03


def test_random_well_formed_calls_rarely_succeed():
    # Uniform over the 5 calls {look, refund, cancel, reply done, reply no} on the requested order, 4 turns:
    # success needs the right reply at turn t (prob 1/5 each) after t-1 calls from {look, refund, cancel}
    # that leave the right status: for "act" goals the last write is the right one ((3**k - 1) / 2 of the 3**k
    # sequences of k calls), so sum_t c(t-1) / 5**t = 1/25 + 4/125 + 13/625 = 0.0928; for refusals only looks
    # (1/5 + 1/25 + 1/125 + 1/625 = 0.2496), or for an order already cancelled also a last write that is a
    # cancel (0.2 + 2/25 + 5/125 + 14/625 = 0.3424). Refund requests: 0.5 * 0.0928 + 0.4 * 0.2496 + 0.1 *
    # (2/3 * 0.2496 + 1/3 * 0.3424) = 0.1743; cancel requests: 0.5 * 0.0928 + 0.5 * (2/3 * 0.2496 + 1/3 *
    # 0.3424) = 0.1867; at medium (even mix) 0.1805.
    env = ServiceDeskEnv(difficulty="medium")
    calls = ["look {}\n", "refund {}\n", "cancel {}\n", "reply done\n", "reply no\n"]
    random_call = lambda instance, observations, rng: rng.choice(calls).format(instance.order_id)
    assert 0.16 < success_rate(env, random_call) < 0.20


def test_random_characters_never_succeed_and_pay_the_penalty_each_turn():
    # The shortest successful play needs a valid reply line such as `reply no\n` (9 set characters, chance
    # 96**-9 per turn): random text is all malformed, so every episode ends truncated at -0.1 per turn.
    env, rng = ServiceDeskEnv(), random.Random(0)
    for _ in range(500):
        episode, rewards = env.new_episode(training_instance(env, rng)), []
        episode.reset()
        for _ in range(env.max_turns):
            length = rng.randint(1, env.max_turn_tokens)
            result = episode.step("".join(rng.choice(CHARACTERS) for _ in range(length)))
            rewards.append(result.reward)
        assert (result.truncated, result.success, sum(rewards)) == (True, False, pytest.approx(-0.4))


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_held_out_instances_are_disjoint_from_training_and_deterministic(difficulty):
    env, rng = ServiceDeskEnv(difficulty=difficulty), random.Random(0)
    training = {env.instance_key(training_instance(env, rng)) for _ in range(3000)}
    held_out = held_out_instances(env, 200, seed=7)
    held_out_keys = {env.instance_key(instance) for instance in held_out}
    assert len(training) > 2000 and len(held_out_keys) == 200  # plenty of distinct instances on both sides
    assert not training & held_out_keys
    assert all(env.is_held_out(instance) for instance in held_out)
    assert held_out == held_out_instances(env, 200, seed=7)
    assert held_out_keys != {env.instance_key(instance) for instance in held_out_instances(env, 200, seed=8)}
    drawn = [env.generate_instance(rng) for _ in range(5000)]
    assert 0.17 < sum(map(env.is_held_out, drawn)) / len(drawn) < 0.23  # held_out_fraction = 0.2


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"difficulty": "impossible"}, "env.difficulty"),
        ({"refund_window_days": 0}, "env.refund_window_days"),
        ({"malformed_reward": 0.5}, "env.malformed_reward"),
        ({"max_turns": 2}, "env.max_turns"),
        ({"held_out_fraction": 0.0}, "env.held_out_fraction"),
        ({"held_out_fraction": 1.0}, "env.held_out_fraction"),
        ({"latency_s": -1.0}, "env.latency_s"),
        ({"episode_timeout_s": 0.0}, "env.episode_timeout_s"),
    ],
)
def test_bad_arguments_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ServiceDeskEnv(**kwargs)


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_every_text_is_in_the_vocabulary_and_episodes_are_short(difficulty):
    env, rng = ServiceDeskEnv(difficulty=difficulty), random.Random(0)
    assert env.turn_stop == "\n" and env.max_turn_tokens == len("reply delivered\n")
    for _ in range(1000):
        instance = training_instance(env, rng)
        prompt, demonstration = env.new_episode(instance).reset(), env.demonstration(instance)
        texts = [
            prompt,
            *(text for turn in demonstration for text in turn),
            *(order.record() for order in instance.orders),
        ]
        assert set("".join(texts)) <= set(CHARACTERS)
        assert all(action.endswith("\n") and len(action) <= env.max_turn_tokens for action, _ in demonstration)
        assert len("".join(texts[: 1 + 2 * len(demonstration)])) <= 70  # e.g. 16 + 8 + 21 + 10 + 3 + 11 = 69
        # Even a play using every turn and every token, answered by the longest observation, stays short.
        longest_observation = max(len(order.record()) for order in instance.orders)
        assert len(prompt) + env.max_turns * (env.max_turn_tokens + longest_observation) <= 170


def test_the_config_node_lists_every_argument_with_its_default():
    node = yaml.safe_load(CONFIG.read_text())
    assert node.pop("_target_") == "lit_asyncrl.envs.ServiceDeskEnv"
    defaults = {name: parameter.default for name, parameter in inspect.signature(ServiceDeskEnv).parameters.items()}
    assert node == defaults
