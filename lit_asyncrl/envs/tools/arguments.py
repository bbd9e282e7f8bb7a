"""How a call's arguments are checked against its tool's parameters schema (`env.arguments`).

- `strict` (`StrictArguments`, the default): the schema as written, by jsonschema.
- `lenient` (`LenientArguments`): also what a JSON-typed tool can take without loss where the schema
  asks for a number: a string that is exactly an integer's or a number's JSON text ("12" for an
  integer, "2.5" for a number; not "12.0", " 12" or "1e3", whose number would not write back the same).
  Suites whose own ground truth passes ids as strings to an integer parameter play right this way; each
  taken string is counted by tool (`rollout/tool_call_coercions/<tool>`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from lit_asyncrl.envs.tools.tool import Tool


@dataclasses.dataclass(frozen=True)
class CheckedArguments:
    """A call's arguments as checked: what the tool is called with, or why it is not called.

    Attributes:
        arguments: the arguments to call the tool with (None when refused).
        problem: why they were refused (jsonschema's message), None when accepted.
        coerced: the arguments taken from a string as the number the schema asks for.
    """

    arguments: dict[str, Any] | None
    problem: str | None = None
    coerced: tuple[str, ...] = ()


class StrictArguments:
    """The schema as written."""

    def check(self, tool: Tool, arguments: Any) -> CheckedArguments:
        problem = tool.argument_errors(arguments)
        return CheckedArguments(None, problem) if problem else CheckedArguments(arguments)


class LenientArguments(StrictArguments):
    """The schema as written, or else its numbers given as their exact JSON text in a string."""

    def check(self, tool: Tool, arguments: Any) -> CheckedArguments:
        strict = super().check(tool, arguments)
        if strict.problem is None or not isinstance(arguments, dict):
            return strict
        properties = tool.parameters.get("properties", {})
        numbers = {
            name: number
            for name, value in arguments.items()
            if (number := _exact_number(value, properties.get(name, {}).get("type"))) is not None
        }
        if not numbers:
            return strict
        converted = {**arguments, **numbers}
        if tool.argument_errors(converted) is not None:
            return strict  # the numbers were not what was wrong: the schema's own message stands
        return CheckedArguments(converted, coerced=tuple(sorted(numbers)))


def _exact_number(value: Any, declared: Any) -> int | float | None:
    """The number `value` (a string) is the exact JSON text of, when the schema declares that type."""
    if not isinstance(value, str) or declared not in ("integer", "number"):
        return None
    try:
        number = json.loads(value)
    except ValueError:
        return None
    if isinstance(number, bool) or not isinstance(number, int | float):
        return None
    if declared == "integer" and not isinstance(number, int):
        return None
    return number if json.dumps(number) == value else None


#: `env.arguments` values and their checks.
ARGUMENT_CHECKS = {"strict": StrictArguments, "lenient": LenientArguments}
