"""Writing a model folder into the cache so that concurrent runs never see it half-written, and build it once."""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock


def cached_model_folder(target: Path, build: Callable[[], tuple[Any, Any]]) -> Path:
    """The model folder at `target`, built by `build()` (which returns the model and its tokenizer) and
    saved there when it is not there yet.

    Concurrent processes wanting the same folder build it once: the first holds a lock beside the folder
    while it builds, the others wait for it and then find the folder complete, instead of each spending
    the build's CPU on the same folder (SmolLM2's GGUF conversion: 28 s on a 2-core machine, which two
    test workers both spent, at the same time, before this lock).
    """
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock"):
        if (target / "config.json").exists():  # built by the process that held the lock before
            return target
        model, tokenizer = build()
        return save_model_folder(model, tokenizer, target)


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
