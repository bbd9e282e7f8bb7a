"""Reference forwards with dropout off: pi_old, pi_ref and an averaged reference are deterministic
policies, so they are scored as the module evaluates, whatever mode the caller left it in."""

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluation_mode(module: nn.Module) -> Iterator[nn.Module]:
    """`module` in eval mode inside the block (dropout off); after it, however the block ends, each
    submodule gets back its own mode (a model may hold parts in eval mode while it trains)."""
    modes = [(submodule, submodule.training) for submodule in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for submodule, training in modes:
            submodule.training = training
