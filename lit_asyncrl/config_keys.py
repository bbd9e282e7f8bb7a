"""Error messages name a setting as the user wrote it, in the front end in use.

The code names a setting by its Hydra key (`rollout.max_model_len`). The Lightning CLI reaches the
same setting through the DataModule's argument (`data.rollout.engine.max_model_len`): its entry says so for
the run (`keys_spelled_as(cli_paths())`, `rollout/settings.py`), and every message renders its keys through
`config_key`, so a Hydra user reads the key they set and a CLI user the path they passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

#: The spellings of the blocks in force, the innermost last.
_blocks: list[Mapping[str, str]] = []


def config_key(key: str) -> str:
    """`key` (a Hydra key, e.g. "rollout.max_model_len") as the front end in use spells it: the
    innermost block decides, by its longest spelled key that is `key` itself or a prefix of it up
    to a dot ("rollout." and "rollout.lora" both name a prefix of "rollout.lora.rank")."""
    for spellings in reversed(_blocks):
        for prefix in sorted(spellings, key=len, reverse=True):
            if key == prefix or key.startswith(prefix if prefix.endswith(".") else prefix + "."):
                return spellings[prefix] + key[len(prefix) :]
    return key


@contextlib.contextmanager
def keys_spelled_as(spellings: Mapping[str, str]) -> Iterator[None]:
    """Within the block, in this process, `config_key` writes a key that is, or starts with, a key
    of `spellings` with its spelling instead (`{"rollout.group_size": "data.rollout.batch.group_size"}`,
    or a prefix such as `{"rollout.": "outer.rollout."}`)."""
    _blocks.append(dict(spellings))
    try:
        yield
    finally:
        _blocks.pop()
