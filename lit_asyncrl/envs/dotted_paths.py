"""Functions named in a config by their dotted path (`mypackage.rewards.length_penalty`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def imported_callable(path: str, key: str) -> Callable[..., Any]:
    """The callable at `path` (`module.attribute`), or a ValueError naming the config `key` that gave it."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{key}: {path!r} is not a dotted path to a function (module.function)")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{key}: cannot import {path!r} ({error})") from error
    if not callable(function):
        raise ValueError(f"{key}: {path!r} is not callable")
    return function
