"""Hydra entry: `python -m lit_asyncrl.train [experiment=NAME] [key=value ...] [-m]`.

The config (conf/train.yaml) instantiates the same classes the Lightning CLI does, with the same
argument names. Each run logs `metrics.csv` and `training_curves.png` into its Hydra run directory.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def run(cfg: DictConfig) -> dict[str, float]:
    """Build the module, the datamodule and the trainer from `cfg` and fit; returns final metrics."""
    import lightning as L
    from hydra.utils import instantiate

    L.seed_everything(cfg.seed, workers=True)
    module = instantiate(cfg.module, _convert_="all")
    datamodule = instantiate(cfg.data, _convert_="all")
    trainer: L.Trainer = instantiate(cfg.trainer, _convert_="all")
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    return {key: float(value) for key, value in trainer.callback_metrics.items()}


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    metrics = run(cfg)
    # Returned for Hydra sweepers that optimise an objective.
    return metrics.get("train/task_success", float("nan"))


if __name__ == "__main__":
    main()
