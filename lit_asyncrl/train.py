"""Hydra entry: `python -m lit_asyncrl.train [experiment=NAME] [key=value ...] [-m]`.

`stage=validate ckpt_path=PATH` evaluates a checkpoint on the held-out instances instead of training;
`stage=validate model=hf model.path=DIR` evaluates a model folder (one `lit-asyncrl export` wrote, say).

The config (conf/train.yaml) instantiates the same classes the Lightning CLI does, with the same
argument names. Each run logs `metrics.csv` and `training_curves.png` into its Hydra run directory.
"""

from __future__ import annotations

from typing import NamedTuple

import hydra
from omegaconf import DictConfig

from lit_asyncrl.config_dir import config_dir
from lit_asyncrl.model_path import NAMED_MODELS
from lit_asyncrl.sweep_dirs import register_resolver

register_resolver()  # conf/train.yaml names sweep jobs' folders with it


class RunOutcome(NamedTuple):
    metrics: dict[str, float]  # the trainer's final callback metrics
    completed: bool  # a fit that reached trainer.max_steps (not stopped early), or a validation
    global_zero: bool  # this process is rank 0 (the one that writes the run's files under DDP)


def run(cfg: DictConfig) -> RunOutcome:
    """Build the module, the datamodule and the trainer from `cfg` and fit (or validate).

    Everything is built (and every config value checked) before any engine starts. Whatever the
    way out (success, exception, Ctrl-C, SIGTERM), the rollout service is closed before this returns.
    Messages name settings by their keys here (`rollout.max_model_len`).
    """
    from lit_asyncrl.model_path import check_model_path

    check_model_path(cfg.model.get("path"))  # a wrong path named at once, before Lightning's imports
    import lightning as L

    from lit_asyncrl.before_fit import launch_and_warm_start
    from lit_asyncrl.lifecycle import finish_wandb_run, quiet_known_warnings, sigterm_raises

    quiet_known_warnings()
    stage = cfg.get("stage", "fit")
    L.seed_everything(cfg.seed, workers=True)
    module, datamodule, warm_start, trainer = build(cfg)
    ckpt_path = cfg.get("ckpt_path")
    with sigterm_raises():
        try:
            if stage == "validate":
                trainer.validate(module, datamodule=datamodule, ckpt_path=ckpt_path)
                return RunOutcome(_final_metrics(trainer), completed=True, global_zero=trainer.is_global_zero)
            launch_and_warm_start(module, datamodule, warm_start, trainer, resumed=ckpt_path is not None)
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        finally:
            datamodule.rollouts.close()
            finish_wandb_run()
    completed = not trainer.interrupted and trainer.global_step >= trainer.max_steps
    return RunOutcome(_final_metrics(trainer), completed, trainer.is_global_zero)


def _final_metrics(trainer) -> dict[str, float]:
    return {key: float(value) for key, value in trainer.callback_metrics.items()}


def build(cfg: DictConfig) -> tuple:
    """(module, datamodule, warm start, trainer) from `cfg`, every value and combination checked;
    nothing is started (no engine, no process, no warm start)."""
    from hydra.utils import instantiate

    from lit_asyncrl.before_fit import check_settings

    stage = cfg.get("stage", "fit")
    if stage not in ("fit", "validate"):
        raise ValueError(f"stage must be 'fit' or 'validate', got {stage!r}")
    # Without a checkpoint, validation evaluates a model folder of the user's as it is (an exported
    # run, say); a built-in model alone is what a forgotten ckpt_path would evaluate instead.
    if stage == "validate" and cfg.get("ckpt_path") is None and cfg.model.get("path") in NAMED_MODELS:
        raise ValueError(
            "stage=validate evaluates a checkpoint or a model folder: set ckpt_path=<run dir>/checkpoints/last.ckpt, "
            "or model.path=<a folder written by lit-asyncrl export>"
        )

    module = instantiate(cfg.module, _convert_="all")
    datamodule = instantiate(cfg.data, _convert_="all")
    warm_start = instantiate(cfg.warm_start, _convert_="all")
    # trainer.logger (the CSV log the plots and the report read) first, then the `logger` group's.
    extra_loggers = [instantiate(node, _convert_="all") for node in cfg.get("extra_loggers") or []]
    if extra_loggers:
        from omegaconf import OmegaConf

        trainer_settings = OmegaConf.to_container(cfg.trainer, resolve=True)
        csv_logger = instantiate(trainer_settings.pop("logger"), _convert_="all")
        trainer = instantiate(trainer_settings, _convert_="all", logger=[csv_logger, *extra_loggers])
    else:
        trainer = instantiate(cfg.trainer, _convert_="all")
    check_settings(module, datamodule, trainer)
    return module, datamodule, warm_start, trainer


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def main(cfg: DictConfig) -> float:
    import time
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from lit_asyncrl.run_summary import config_fingerprint, is_finished, read_summary, write_summary

    hydra_cfg = HydraConfig.get()
    _refuse_ddp_in_multirun(cfg, hydra_cfg)
    run_dir = Path(hydra_cfg.runtime.output_dir)
    fingerprint = config_fingerprint(OmegaConf.to_yaml(cfg))
    if cfg.get("skip_finished") and is_finished(run_dir, fingerprint):
        print(f"skipped (finished before with this config): {run_dir}")
        return read_summary(run_dir)["final_metrics"].get("train/task_success", float("nan"))
    start = time.perf_counter()
    metrics, completed, global_zero = run(cfg)
    if completed and global_zero and cfg.get("stage", "fit") == "fit":
        write_summary(run_dir, list(hydra_cfg.overrides.task), time.perf_counter() - start, metrics, fingerprint)
    # Returned for Hydra sweepers that optimise an objective.
    return metrics.get("train/task_success", float("nan"))


def _refuse_ddp_in_multirun(cfg: DictConfig, hydra_cfg) -> None:
    """Lightning starts DDP's other processes by running this command line again: under `-m` each
    would launch the whole sweep. A sweep runs its jobs one process each (or through a launcher)."""
    from hydra.types import RunMode

    devices = cfg.trainer.get("devices", 1)
    num_nodes = cfg.trainer.get("num_nodes", 1)
    several = (
        (isinstance(devices, int) and devices > 1)
        or (not isinstance(devices, (int, str)) and len(devices) > 1)
        or num_nodes > 1
    )
    if hydra_cfg.mode == RunMode.MULTIRUN and several:
        raise ValueError(
            f"trainer.devices={devices} (trainer.num_nodes={num_nodes}) starts DDP processes by running the command "
            "again, which a multirun (-m) cannot do: run DDP jobs one at a time, without -m"
        )


if __name__ == "__main__":
    main()
