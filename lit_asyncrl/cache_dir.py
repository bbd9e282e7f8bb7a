"""Where lit_asyncrl keeps what outlives a run: built model folders, torch's compile cache."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`LIT_ASYNCRL_CACHE`, or ~/.cache/lit_asyncrl."""
    return Path(os.environ.get("LIT_ASYNCRL_CACHE", Path.home() / ".cache" / "lit_asyncrl"))


def keep_torch_compile_cache_here() -> None:
    """Point torch's compile cache at our cache dir unless the user chose one.

    Importing vLLM imports `torch._dynamo.package`, which makes the cache dir at once, by default
    `torchinductor_<user>` in the temp dir: every process that imports vLLM (the trainer, each
    engine, each Ray worker) would leave it in /tmp. Set before vLLM is imported; processes started
    later inherit it.
    """
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(default_cache_dir() / "torchinductor"))
