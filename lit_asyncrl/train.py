"""Hydra entry: `python -m lit_asyncrl.train [experiment=NAME] [key=value ...] [-m]`.

`stage=validate ckpt_path=PATH` evaluates a checkpoint on the held-out instances instead of training.

The config (conf/train.yaml) instantiates the same classes the Lightning CLI does, with the same
argument names. Each run logs `metrics.csv` and `training_curves.png` into its Hydra run directory.
"""

from __future__ import annotations

from typing import NamedTuple

import hydra
from omegaconf import DictConfig

from lit_asyncrl.config_dir import config_dir


class RunOutcome(NamedTuple):
    metrics: dict[str, float]  # the trainer's final callback metrics
    completed: bool  # a fit that reached trainer.max_steps (not stopped early), or a validation


def run(cfg: DictConfig) -> RunOutcome:
    """Build the module, the datamodule and the trainer from `cfg` and fit (or validate).

    Everything is built (and every config value checked) before any engine starts. Whatever the
    way out (success, exception, Ctrl-C, SIGTERM), the rollout service is closed before this returns.
    """
    import lightning as L

    from lit_asyncrl.lifecycle import quiet_known_warnings, sigterm_raises
    from lit_asyncrl.warm_start import load_tokenizer

    quiet_known_warnings()
    stage = cfg.get("stage", "fit")
    L.seed_everything(cfg.seed, workers=True)
    module, datamodule, warm_start, trainer = build(cfg)
    ckpt_path = cfg.get("ckpt_path")
    with sigterm_raises():
        try:
            if stage == "validate":
                trainer.validate(module, datamodule=datamodule, ckpt_path=ckpt_path)
                return RunOutcome(_final_metrics(trainer), completed=True)
            # The engine's start (mostly its process importing) overlaps the warm start.
            datamodule.rollouts.launch_early()
            if ckpt_path is None:  # a resumed run already has its warmed-up weights
                warm_start.run(
                    module.policy,
                    datamodule.env,
                    load_tokenizer(datamodule.model_path),
                    log_dir=trainer.log_dir,
                    accelerator=trainer.accelerator,
                )
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        finally:
            datamodule.rollouts.close()
    completed = not trainer.interrupted and trainer.global_step >= trainer.max_steps
    return RunOutcome(_final_metrics(trainer), completed)


def _final_metrics(trainer) -> dict[str, float]:
    return {key: float(value) for key, value in trainer.callback_metrics.items()}


def build(cfg: DictConfig) -> tuple:
    """(module, datamodule, warm start, trainer) from `cfg`, every value and combination checked;
    nothing is started (no engine, no process, no warm start)."""
    from hydra.utils import instantiate

    stage = cfg.get("stage", "fit")
    if stage not in ("fit", "validate"):
        raise ValueError(f"stage must be 'fit' or 'validate', got {stage!r}")
    if stage == "validate" and cfg.get("ckpt_path") is None:
        raise ValueError("stage=validate evaluates a checkpoint: set ckpt_path=<run dir>/checkpoints/last.ckpt")

    module = instantiate(cfg.module, _convert_="all")
    datamodule = instantiate(cfg.data, _convert_="all")
    warm_start = instantiate(cfg.warm_start, _convert_="all")
    trainer = instantiate(cfg.trainer, _convert_="all")
    module.reference.check_rollout_settings(datamodule.rollouts.max_version_gap)
    return module, datamodule, warm_start, trainer


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def main(cfg: DictConfig) -> float:
    import time
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from lit_asyncrl.run_summary import config_fingerprint, is_finished, read_summary, write_summary

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    fingerprint = config_fingerprint(OmegaConf.to_yaml(cfg))
    if cfg.get("skip_finished") and is_finished(run_dir, fingerprint):
        print(f"skipped (finished before with this config): {run_dir}")
        return read_summary(run_dir)["final_metrics"].get("train/task_success", float("nan"))
    start = time.perf_counter()
    metrics, completed = run(cfg)
    if completed and cfg.get("stage", "fit") == "fit":
        write_summary(run_dir, list(hydra_cfg.overrides.task), time.perf_counter() - start, metrics, fingerprint)
    # Returned for Hydra sweepers that optimise an objective.
    return metrics.get("train/task_success", float("nan"))


if __name__ == "__main__":
    main()
