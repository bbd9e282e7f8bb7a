"""Error messages name a setting as the user wrote it, in the front end in use.

The code names a setting by its path in the Lightning CLI (`data.max_model_len`: the DataModule's
argument). The Hydra entry writes the same setting under another key (`rollout.max_model_len`,
which `conf/train.yaml` forwards to `data.max_model_len`); it says so for the run
(`keys_spelled_as`), and every message renders its keys through `config_key`, so a Hydra user reads
the key they set and a CLI user the path they passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

_spelling: dict[str, str] = {}


def config_key(path: str) -> str:
    """`path` (a Lightning CLI path, e.g. "data.max_model_len") as the front end in use spells it."""
    return _spelling.get(path, path)


@contextlib.contextmanager
def keys_spelled_as(spelling: Mapping[str, str]) -> Iterator[None]:
    """Within the block, in this process, `config_key(path)` gives `spelling[path]` where it has one."""
    saved = dict(_spelling)
    _spelling.update(spelling)
    try:
        yield
    finally:
        _spelling.clear()
        _spelling.update(saved)


def forwarded_keys(config: Any, section: str = "data") -> dict[str, str]:
    """{"data.<argument>": "<key>"} for every argument of `config[section]` that the Hydra config
    sets to a bare interpolation `${<key>}` (before resolution), e.g. `max_model_len: ${rollout.max_model_len}`."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(config[section], resolve=False)
    spelling = {}
    for argument, value in raw.items():
        if isinstance(value, str) and value.startswith("${") and value.endswith("}") and value.count("${") == 1:
            spelling[f"{section}.{argument}"] = value[2:-1]
    return spelling
