"""Error messages name a setting as the user wrote it, in the front end in use.

The code names a setting by its Hydra key (`rollout.max_model_len`). The Lightning CLI reaches the
same setting through the DataModule's argument (`data.rollout.max_model_len`): its entry says so for
the run (`keys_spelled_as(CLI_SPELLING)`), and every message renders its keys through `config_key`,
so a Hydra user reads the key they set and a CLI user the path they passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

#: Hydra key prefix -> the Lightning CLI's path prefix for the same settings.
CLI_SPELLING = {"rollout.": "data.rollout."}

_prefixes: dict[str, str] = {}


def config_key(key: str) -> str:
    """`key` (a Hydra key, e.g. "rollout.max_model_len") as the front end in use spells it."""
    for prefix, spelled in _prefixes.items():
        if key.startswith(prefix):
            return spelled + key[len(prefix) :]
    return key


@contextlib.contextmanager
def keys_spelled_as(prefixes: Mapping[str, str]) -> Iterator[None]:
    """Within the block, in this process, `config_key` writes a key starting with a prefix of
    `prefixes` with that prefix's spelling instead (`{"rollout.": "data.rollout."}`)."""
    saved = dict(_prefixes)
    _prefixes.update(prefixes)
    try:
        yield
    finally:
        _prefixes.clear()
        _prefixes.update(saved)
