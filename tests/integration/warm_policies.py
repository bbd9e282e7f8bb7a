"""Warm-started tiny policies built once per test session and handed to runs as `model.path`.

A run's own warm start is its first phase; tests that do not test the warm start itself skip it by
starting from a policy that already had it. 120 warm-start steps on the service desk take about
20 s of a run (measured alone; more beside another test worker), paid here once per session, not
once per run. The pytest-xdist workers share one build through a file lock.
"""

from __future__ import annotations

from pathlib import Path

import torch
from filelock import FileLock
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from transformers import AutoModelForCausalLM

from lit_asyncrl.config_dir import config_dir
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.models.folder import save_model_folder
from lit_asyncrl.warm_start import WarmStart, load_tokenizer


def warm_started_policy(root: Path, experiment: str, steps: int) -> Path:
    """The tiny policy's folder after `steps` warm-start steps on `experiment`'s task, at the
    experiment's warm-start learning rate and seed (built under `root` the first time it is asked for)."""
    target = root / f"warm-{experiment}-{steps}"
    with FileLock(f"{target}.lock"):
        if not (target / "config.json").exists():
            with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
                cfg = compose(config_name="train", overrides=[f"experiment={experiment}"])
            env = instantiate(cfg.env, _convert_="all")
            base = resolve_model_path(None)
            policy = AutoModelForCausalLM.from_pretrained(base)
            tokenizer = load_tokenizer(str(base))
            # One thread: two test workers building at once, each with a thread per core, spin
            # against each other (measured: 120 steps took over 90 s each, against 17-20 s alone).
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                WarmStart(steps=steps, lr=cfg.model.warm_start_lr, seed=cfg.seed).run(
                    policy, env, tokenizer, accelerator="cpu", enable_progress_bar=False
                )
            finally:
                torch.set_num_threads(threads)
            save_model_folder(policy, tokenizer, target)
    return target
