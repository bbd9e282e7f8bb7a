"""Tool tasks (`envs/tools`): hand-written model outputs, read by vLLM's hermes parser, answered call by call."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from lit_asyncrl.envs.tools import AssistantTurn, Ending, Grade, Tool, ToolCall, ToolEnv, as_tool
from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
from lit_asyncrl.rollout.episodes.tool_calls import ToolCallParser
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm


class Ledger:
    """The state the tools act on: what was added, and the calls in the order they ran."""

    def __init__(self) -> None:
        self.total, self.ran = 0, []

    def add(self, amount: int) -> str:
        """Add to the total.

        Args:
            amount: How much to add.
        """
        self.ran.append(("add", amount))
        self.total += amount
        return f"total {self.total}"

    async def fetch(self, key: str) -> dict:
        """Fetch a value (an async tool).

        Args:
            key: Which value.
        """
        await asyncio.sleep(0.01)
        self.ran.append(("fetch", key))
        return {"key": key, "value": 7}

    def explode(self) -> str:
        """Always fails."""
        raise RuntimeError("the back end is down")

    def stall(self) -> str:
        """Takes longer than the task allows."""
        time.sleep(0.5)
        return "late"


class LedgerTask(ToolEnv):
    def generate_instance(self, rng: random.Random) -> int:
        return rng.randint(1, 9)

    def new_state(self, instance: int) -> Ledger:
        return Ledger()

    def tools(self, state: Ledger) -> list:
        return [state.add, state.fetch, state.explode, state.stall]

    def opening(self, instance: int) -> list[dict]:
        return [{"role": "user", "content": f"add {instance}"}]

    def grade(self, ending: Ending) -> Grade:
        return Grade(1.0 if ending.state.total == self.target else 0.0, ending.state.total == self.target)

    target = 5


@pytest.fixture(scope="module")
def parser():
    return ToolCallParser("hermes", build_char_tokenizer())


def play(turn_texts: list[str], parser, **settings):
    """(transitions, episode) after the model wrote `turn_texts`, each read by the parser."""
    episode = LedgerTask(tool_timeout_s=0.1, call_error_reward=-0.25, **settings).new_episode(5)
    episode.reset()

    async def run():
        return [await episode.step(parser.parse(text)) for text in turn_texts]

    return asyncio.run(run()), episode


def test_several_calls_run_in_order_each_answered_by_a_tool_message(parser):
    text = '<tool_call>{"name": "add", "arguments": {"amount": 2}}</tool_call>\n<tool_call>{"name": "fetch", "arguments": {"key": "x"}}</tool_call><tool_call>{"name": "add", "arguments": {"amount": 3}}</tool_call>'
    (step,), episode = play([text], parser)
    assert episode.state.ran == [("add", 2), ("fetch", "x"), ("add", 3)]
    assert [(answer.name, answer.content, answer.error) for answer in step.observation] == [
        ("add", "total 2", None),
        ("fetch", '{"key": "x", "value": 7}', None),  # an async tool; a dict result is sent as JSON
        ("add", "total 5", None),
    ]
    assert (step.reward, step.terminated, step.truncated) == (0.0, False, False)
    assert step.info == {"tool_calls": {"add": 2, "fetch": 1}, "tool_call_errors": {}, "tool_call_coercions": {}}


def test_a_turn_without_a_call_ends_the_episode_graded_on_its_state(parser):
    steps, episode = play(
        ['<tool_call>{"name": "add", "arguments": {"amount": 5}}</tool_call>', "The total is 5."], parser
    )
    assert (steps[1].reward, steps[1].terminated, steps[1].success) == (1.0, True, True)
    assert episode.transcript == [
        {"role": "user", "content": "add 5"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"amount": 5}}, "id": step_id(steps[0])}
            ],
        },
        {"role": "tool", "content": "total 5", "name": "add", "tool_call_id": step_id(steps[0])},
        {"role": "assistant", "content": "The total is 5."},
    ]


def step_id(step) -> str:
    (answer,) = step.observation
    assert answer.call_id.startswith("chatcmpl-tool-")  # the parser's own call id, kept
    return answer.call_id


@pytest.mark.parametrize(
    ("text", "reason", "answer"),
    [
        (
            '<tool_call>{"name": "add", "arguments": {"amount": 2}</tool_call>',
            "unparsable",
            "Error: the tool call could not be parsed (write it as valid JSON)",
        ),
        (
            '<tool_call>{"name": "mul", "arguments": {"amount": 2}}</tool_call>',
            "unknown_tool",
            "Error: there is no tool named 'mul' (the tools: add, fetch, explode, stall)",
        ),
        (
            '<tool_call>{"name": "add", "arguments": {"amount": "two"}}</tool_call>',
            "invalid_arguments",
            "Error: invalid arguments for add: 'two' is not of type 'integer'",
        ),
        (
            '<tool_call>{"name": "add", "arguments": {}}</tool_call>',
            "invalid_arguments",
            "Error: invalid arguments for add: 'amount' is a required property",
        ),
        (
            '<tool_call>{"name": "add", "arguments": [2]}</tool_call>',
            "invalid_arguments",
            "Error: invalid arguments for add: arguments must be a JSON object, got [2]",
        ),
        (
            '<tool_call>{"name": "explode", "arguments": {}}</tool_call>',
            "tool_error",
            "Error: explode failed: the back end is down",
        ),
        ('<tool_call>{"name": "stall", "arguments": {}}</tool_call>', "timeout", "Error: stall took longer than 0.1 s"),
    ],
    ids=["bad json", "unknown tool", "wrong type", "missing argument", "not an object", "tool raises", "timeout"],
)
def test_a_call_that_cannot_run_is_answered_with_an_error_and_counted_by_reason(parser, text, reason, answer):
    (step,), episode = play([text], parser)
    assert [(message.content, message.error) for message in step.observation] == [(answer, reason)]
    assert step.info["tool_call_errors"] == {reason: 1}
    assert step.info["tool_calls"] == ({} if reason in ("unparsable", "unknown_tool") else {text.split('"')[3]: 1})
    assert not step.done and episode.state.total == 0  # the episode goes on; nothing was added
    assert step.reward == (0.0 if reason == "timeout" else -0.25)  # a slow tool is not the model's fault


def test_out_of_turns_the_episode_is_truncated_and_graded(parser):
    call = '<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call>'
    steps, _ = play([call, call], parser, max_turns=2)
    assert (steps[1].truncated, steps[1].terminated, steps[1].success, steps[1].reward) == (True, False, False, 0.0)


def test_tools_take_their_schema_from_type_hints_and_docstrings_or_a_given_one():
    assert as_tool(Ledger().add).schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add to the total.",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "integer", "description": "How much to add."}},
                "required": ["amount"],
            },
            "return": {"type": "string"},
        },
    }
    schema = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    assert as_tool(Tool(schema, lambda: "pong")).name == "ping"

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="the tool 'undocumented' has no JSON schema"):
        as_tool(undocumented)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        # The third-party suite's `dict`, which is no JSON type: refused when the task is built.
        (
            {"type": "object", "properties": {"order_id": {"type": "dict"}}},
            r"the tool 'lookup' has an invalid parameters schema at properties\.order_id\.type: 'dict' is not valid",
        ),
        (
            {"type": "object", "required": "order_id"},
            r"the tool 'lookup' has an invalid parameters schema at required: 'order_id' is not of type 'array'",
        ),
    ],
)
def test_an_invalid_parameters_schema_is_refused_naming_the_tool_and_the_field(parameters, message):
    schema = {"type": "function", "function": {"name": "lookup", "parameters": parameters}}
    with pytest.raises(ValueError, match=message):
        Tool(schema, lambda order_id: order_id)


def test_the_parser_reads_a_turn_whole():
    # vLLM's hermes parser: text before the first call is the content; a plain turn has no calls.
    parser = ToolCallParser("hermes", build_char_tokenizer())
    assert (
        parser.parse('Checking.<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call>').content
        == "Checking."
    )
    assert parser.parse("All done.") == AssistantTurn("All done.", (), unparsable=False)
    assert [
        (call.name, call.arguments)
        for call in parser.parse('<tool_call>{"name": "a", "arguments": {"k": [1]}}</tool_call>').calls
    ] == [("a", {"k": [1]})]
    with pytest.raises(ValueError, match="env.tool_parser='no_such_parser' is not one of vLLM's tool parsers"):
        ToolCallParser("no_such_parser", build_char_tokenizer())


def test_demonstrations_play_the_scripted_calls_against_a_fresh_episode():
    class Scripted(LedgerTask):
        def demonstration_calls(self, instance):
            return [[ToolCall("add", {"amount": 2}), ToolCall("add", {"amount": 3})], []]

    (first, answers), (last, final_answers) = Scripted().demonstration(5)
    assert [message.content for message in answers] == ["total 2", "total 5"]
    assert last.calls == () and final_answers == []


def test_the_tool_task_of_docs_tasks_md_plays_as_written(parser):
    source = (Path(__file__).resolve().parents[2] / "docs" / "tasks.md").read_text()
    code = source.split("A tool task, end to end", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/tasks.md", "exec"), namespace)
    task = namespace["StockTask"]()
    instance = task.generate_instance(random.Random(0))  # ((("mug", 6), ("hat", 6)), "hat") for seed 0
    item, stock = instance[1], dict(instance[0])
    episode = task.new_episode(instance)
    assert episode.reset().messages == ({"role": "user", "content": f"how many {item}s do you have?"},)

    async def run():
        counted = await episode.step(
            parser.parse(f'<tool_call>{{"name": "count", "arguments": {{"item": "{item}"}}}}</tool_call>')
        )
        answered = await episode.step(
            parser.parse(
                f'<tool_call>{{"name": "answer_customer", "arguments": {{"number": {stock[item]}}}}}</tool_call>'
            )
        )
        return counted, answered

    counted, answered = asyncio.run(run())
    assert [message.content for message in counted.observation] == [str(stock[item])]
    assert (answered.terminated, answered.reward, answered.success) == (True, 1.0, True)
