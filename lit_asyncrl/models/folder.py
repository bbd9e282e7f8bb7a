"""Writing a model folder into the cache so that concurrent runs never see it half-written."""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from pathlib import Path
from typing import Any


def save_model_folder(model: Any, tokenizer: Any, target: Path) -> Path:
    """Save `model` and `tokenizer` as a Hugging Face folder at `target` and return it.

    They are written into a temporary sibling that is renamed at the end: a run that finds
    `target` finds it complete, and when two runs race, the loser's identical copy is discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' "Writing model shards" bar
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process won the race; its folder is identical
        shutil.rmtree(staging, ignore_errors=True)
    return target
