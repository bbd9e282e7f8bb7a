"""Reference forwards with dropout off: pi_old, pi_ref and an averaged reference are deterministic
policies, so they are scored as the module evaluates, whatever mode the caller left it in."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.nn.modules.dropout import _DropoutNd

#: How the names of dropout probabilities end: `dropout`, `attention_dropout`, GPT-2's `resid_pdrop`,
#: BERT's `hidden_dropout_prob`, T5's `dropout_rate`.
_DROPOUT_SUFFIXES = ("dropout", "pdrop", "dropout_prob", "dropout_rate")


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


def has_active_dropout(module: nn.Module) -> bool:
    """Whether a forward of `module` in its present mode may drop activations, so that it differs from
    the eval-mode forward. A false answer means the two forwards are the same; a true one may be
    cautious (a setting above 0 that no layer reads costs one forward where a caller's log-probs would
    have done, never a wrong value)."""
    configs: dict[int, Any] = {}
    for submodule in module.modules():
        if not submodule.training:
            continue  # nn.Dropout and the functional dropouts below all read `self.training`
        # nn.Dropout, Dropout1d/2d/3d, AlphaDropout, peft's `lora_dropout`: the layer holds its p.
        if isinstance(submodule, _DropoutNd) and submodule.p > 0:
            return True
        # Dropout applied functionally from a number the module keeps, e.g. Llama/Qwen attention's
        # `self.attention_dropout`, Bloom's `self.hidden_dropout` or nanoGPT's `self.dropout`, passed to
        # sdpa's `dropout_p` or `F.dropout(..., training=self.training)`: there is no dropout layer to find.
        if _dropout_settings(vars(submodule)):
            return True
        # Hugging Face models that read it from their config at call time (Falcon's
        # `self.config.hidden_dropout`), and any other functional use: the config is the source of
        # every such number. Checked once per config object (each attention layer holds the model's).
        config = getattr(submodule, "config", None)
        if config is not None and id(config) not in configs:
            configs[id(config)] = config
            if _dropout_settings(getattr(config, "__dict__", {})):
                return True
    return False


def _dropout_settings(fields: dict[str, Any]) -> bool:
    """Whether `fields` (an object's attributes) hold a dropout probability above 0."""
    return any(
        name.endswith(_DROPOUT_SUFFIXES)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and value > 0
        for name, value in fields.items()
    )
