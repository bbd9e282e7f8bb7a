"""Strategies by name: ``get_loss("decoupled_ppo", discrepancy_bounds=(0.99, 1.01), ...)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from lit_asyncrl.losses.base import LossStrategy

StrategyType = TypeVar("StrategyType", bound=type[LossStrategy])

_STRATEGIES: dict[str, type[LossStrategy]] = {}


def register_loss(name: str) -> Callable[[StrategyType], StrategyType]:
    """Class decorator registering a :class:`LossStrategy` subclass under ``name``."""

    def decorate(cls: StrategyType) -> StrategyType:
        if name in _STRATEGIES:
            raise ValueError(f"loss {name!r} is already registered by {_STRATEGIES[name].__name__}")
        cls.name = name
        _STRATEGIES[name] = cls
        return cls

    return decorate


def available_losses() -> list[str]:
    """Registered names, sorted."""
    return sorted(_STRATEGIES)


def loss_class(name: str) -> type[LossStrategy]:
    """The class registered under ``name``; ValueError listing the available names otherwise."""
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; available: {', '.join(available_losses())}") from None


def get_loss(name: str, **kwargs: Any) -> LossStrategy:
    """Build the strategy registered under ``name`` from keyword arguments (config keys).

    Raises:
        ValueError: unknown name (lists the available ones), unknown argument (lists the accepted
            ones) or invalid value (names the argument).
    """
    cls = loss_class(name)
    accepted = [p for p in inspect.signature(cls).parameters]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ValueError(f"{name}: unknown argument(s) {unknown}; accepted: {accepted}")
    return cls(**kwargs)
