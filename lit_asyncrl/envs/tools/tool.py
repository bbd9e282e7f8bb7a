"""A tool an agent can call: its name, its JSON schema (what the model is shown) and the callable that runs it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jsonschema


@dataclasses.dataclass(frozen=True)
class Tool:
    """One callable tool. `schema` is an OpenAI-style function schema:
    `{"type": "function", "function": {"name", "description", "parameters"}}`; `function` takes the
    call's arguments as keywords and may be `async def`."""

    schema: dict[str, Any]
    function: Callable[..., Any]

    def __post_init__(self) -> None:
        function = self.schema.get("function") if isinstance(self.schema, dict) else None
        if self.schema.get("type") != "function" or not isinstance(function, dict) or not function.get("name"):
            raise ValueError(
                "a tool schema must look like {'type': 'function', 'function': {'name': ..., 'parameters': ...}}, "
                f"got {self.schema!r}"
            )
        if not callable(self.function):
            raise TypeError(f"the tool {function['name']!r} needs a callable, got {self.function!r}")
        # Checked now, when the task is built: an invalid schema would otherwise fail every call of
        # every episode as an environment error that names no tool.
        validator = jsonschema.validators.validator_for(self.parameters)
        try:
            validator.check_schema(self.parameters)
        except jsonschema.SchemaError as error:
            field = ".".join(str(part) for part in error.path) or "(the schema itself)"
            raise ValueError(
                f"the tool {function['name']!r} has an invalid parameters schema at {field}: {error.message}"
            ) from None

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters", {"type": "object", "properties": {}})

    def argument_errors(self, arguments: Any) -> str | None:
        """Why `arguments` do not match the schema's parameters (jsonschema's message), None if they do."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {arguments!r}"
        try:
            jsonschema.validate(arguments, self.parameters)
        except jsonschema.ValidationError as error:
            return error.message
        return None


def as_tool(tool: Tool | Callable[..., Any]) -> Tool:
    """A `Tool` as it is, or a plain function (or bound method) whose schema transformers derives
    from its type hints and its docstring's `Args:` section (`get_json_schema`)."""
    if isinstance(tool, Tool):
        return tool
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(tool)
    except Exception as error:  # transformers says what is missing: a type hint, a docstring, an argument's description
        name = getattr(tool, "__name__", repr(tool))
        raise ValueError(
            f"the tool {name!r} has no JSON schema: {error} "
            "(give it type hints and a docstring with an Args: section, or pass a Tool)"
        ) from error
    return Tool(schema=schema, function=tool)
