"""Writes the Lightning CLI configs (conf/cli/<run>.yaml) from the Hydra configs, so both front
ends start equal objects: `python -m lit_asyncrl.cli_configs` (a test checks they are current).

`default.yaml` is the Hydra default run; `<experiment>.yaml` is `experiment=<experiment>`.
`_target_` becomes `class_path` + `init_args` (the `RolloutConfig` dataclass takes its fields
bare); `data.model_path` is linked from `model.model_path`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lit_asyncrl.config_dir import config_dir
from lit_asyncrl.rollout.settings import nested_keys

HEADER = """\
# Generated from the Hydra config{what} by `python -m lit_asyncrl.cli_configs`; do not edit.
# lit-asyncrl fit --config conf/cli/{name}.yaml [--trainer.max_steps N]
"""


def hydra_runs() -> dict[str, list[str]]:
    """Run name -> Hydra overrides, for the default run and every shipped experiment."""
    experiments = sorted(path.stem for path in (Path(config_dir()) / "experiment").glob("*.yaml"))
    return {"default": [], **{name: [f"experiment={name}"] for name in experiments}}


def compose_run(overrides: list[str]) -> Any:
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def to_class_path(node: Any) -> Any:
    """Hydra `_target_` dicts -> jsonargparse `class_path` / `init_args`, recursively."""
    if isinstance(node, dict):
        converted = {key: to_class_path(value) for key, value in node.items() if key != "_target_"}
        if "_target_" in node:
            return {"class_path": node["_target_"], **({"init_args": converted} if converted else {})}
        return converted
    if isinstance(node, list):
        return [to_class_path(value) for value in node]
    return node


def cli_config(name: str, cfg: Any) -> dict[str, Any]:
    """The CLI config of run `name` from its composed Hydra config `cfg`."""
    section = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("module", "data", "warm_start")}
    model = to_class_path(section["module"])["init_args"]
    data = to_class_path(section["data"])["init_args"]
    data.pop("model_path")  # linked from model.model_path
    # A dataclass of one settings object per concern: the CLI takes the Hydra keys by part.
    data["rollout"] = nested_keys(data["rollout"]["init_args"])
    # Dataclasses too; the engines' adapter is the module's (the run refuses two different ones).
    model["lora"] = model["lora"]["init_args"]
    data["rollout"]["engine"]["lora"] = data["rollout"]["engine"]["lora"]["init_args"]
    warm_start = to_class_path(section["warm_start"])["init_args"]
    trainer = OmegaConf.to_container(cfg.trainer, resolve=False)
    run_dir = f"outputs/cli/{name}"
    return {
        "seed_everything": cfg.seed,
        "trainer": {
            "accelerator": trainer["accelerator"],
            "devices": trainer["devices"],
            "max_steps": trainer["max_steps"],
            "max_epochs": trainer["max_epochs"],
            "log_every_n_steps": trainer["log_every_n_steps"],
            "gradient_clip_val": trainer["gradient_clip_val"],
            "default_root_dir": run_dir,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {
                    "save_dir": run_dir,
                    "name": "",
                    "version": "",
                    "flush_logs_every_n_steps": trainer["logger"]["flush_logs_every_n_steps"],
                },
            },
            "callbacks": [
                {"class_path": "lit_asyncrl.plots.TrainingCurvesPlot"},
                {
                    "class_path": "lit_asyncrl.trainer_callbacks.TrainedEpisodesWriter",
                    "init_args": {"dirpath": f"{run_dir}/trained_episodes", "enabled": cfg.save_trained_episodes},
                },
                # Periodic checkpoints (the latest kept) and the final state in last.ckpt, as in Hydra.
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"filename": "{step}", "every_n_train_steps": cfg.checkpoint_every, "save_top_k": 1},
                },
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"filename": "last", "enable_version_counter": False},
                },
            ],
        },
        "model": model,
        "warm_start": warm_start,
        "data": data,
    }


def render(name: str, overrides: list[str]) -> str:
    """The text of `conf/cli/<name>.yaml` for the run the Hydra `overrides` compose."""
    return render_composed(name, overrides, compose_run(overrides))


def render_composed(name: str, overrides: list[str], cfg: Any) -> str:
    """`render` from `cfg`, the config `overrides` composed (a caller that composed it already)."""
    what = f" (experiment={name})" if overrides else " (default run)"
    return HEADER.format(what=what, name=name) + yaml.safe_dump(
        cli_config(name, cfg), sort_keys=False, default_flow_style=False
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(config_dir()) / "cli"), help="folder for the CLI configs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, overrides in hydra_runs().items():
        (out / f"{name}.yaml").write_text(render(name, overrides))
        print(out / f"{name}.yaml")


if __name__ == "__main__":
    main()
