"""Whether a `model.path` setting names something a model can load from, checked without loading
anything (this module imports neither torch nor transformers, so the Hydra entry names a wrong
path within a second, before Lightning's imports)."""

from __future__ import annotations

import re
from pathlib import Path

#: The models the project builds or converts itself (`models/resolve.py`): no folder to look for.
NAMED_MODELS = (None, "", "tiny", "tiny_moe", "smollm2_135m")
# "owner/name" as the Hugging Face hub spells repository ids: one slash, no leading "/", "." or "~".
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_model_path(path: str | None) -> None:
    """Refuse a `model.path` that is neither a named model, a local Hugging Face model folder (with
    config.json) nor a hub id (a path that does not exist locally and reads as owner/name).

    Raises:
        ValueError: naming `model.path` and what it may be set to.
    """
    if path in NAMED_MODELS:
        return
    folder = Path(path).expanduser()
    if (folder / "config.json").is_file() or (not folder.exists() and HUB_ID.fullmatch(path)):
        return
    raise ValueError(
        f"model.path={path!r} is not a local Hugging Face model folder (no config.json there); "
        "set model.path (Lightning CLI: --model.model_path) to such a folder, to a hub id owner/name "
        "(downloaded when online), to smollm2_135m, to tiny_moe for the built-in mixture-of-experts policy, "
        "or to null for the built-in tiny policy"
    )
