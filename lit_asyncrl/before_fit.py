"""What both entry points (Hydra and the Lightning CLI) do between building the parts and `fit`."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.datamodule import RolloutDataModule
from lit_asyncrl.fsdp import check_reference_supported
from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.rollout.serving.distributed import check_batch_splits
from lit_asyncrl.warm_start import WarmStart, load_tokenizer


def check_settings(module: AsyncRLModule, datamodule: RolloutDataModule, trainer: L.Trainer) -> None:
    """Combinations of module, data and trainer settings, refused before anything starts."""
    module.reference.check_rollout_settings(datamodule.rollouts)
    check_batch_splits(datamodule.rollouts.groups_per_batch, trainer.world_size)
    check_reference_supported(trainer.strategy, module.reference, fidelity=module.fidelity is not None)
    check_lora_supported(module.lora, datamodule.rollout_config.engine.lora, module.reference, trainer.strategy)
    check_routing_replay(module, datamodule.rollout_config.engine.capture_routing)
    warn_of_replaced_metrics(trainer)


def check_routing_replay(module: AsyncRLModule, capture_routing: bool) -> None:
    """`model.routing_replay` needs an MoE policy, the engine's routing, and a reference that scores in the step."""
    from lit_asyncrl.models.moe_routing import topk_routers
    from lit_asyncrl.reference.registry import reference_name

    if not module.hparams.routing_replay:
        return
    if not topk_routers(module.policy):
        raise ValueError(
            f"model.routing_replay=true replays which experts the engine routed each token to, but "
            f"model.path={module.hparams.model_path} ({type(module.policy).__name__}) has no expert routers"
        )
    if not capture_routing:
        capture = config_key("rollout.capture_routing")
        raise ValueError(f"model.routing_replay=true replays the routing the engine records: set {capture}=true")
    if not module.reference.scores_in_the_step:
        raise ValueError(
            f"model.routing_replay=true with reference={reference_name(module.reference)}: it scores pi_old "
            "while turns are still in flight, before the engine hands over their routing; use reference=snapshot "
            "or ewma (pi_old scored in the training step, under the engine's routing)"
        )


def check_lora_supported(
    module_lora: LoRASettings, engine_lora: LoRASettings, reference: object, strategy: object
) -> None:
    """The engines serve the adapter the module trains, through routes that know adapters."""
    from lit_asyncrl.fsdp import STRATEGY_NAME, FSDP2Strategy
    from lit_asyncrl.reference.attached import DedicatedReference, InterruptSyncReference

    if module_lora != engine_lora:
        raise ValueError(
            f"model.lora ({module_lora}) and {config_key('rollout.lora')} ({engine_lora}) differ: "
            "the engines serve the adapter the module trains, so set both alike "
            "(the Hydra config ties rollout.lora to model.lora)"
        )
    if module_lora.enabled and isinstance(strategy, FSDP2Strategy):
        raise ValueError(
            f"model.lora.rank={module_lora.rank} under trainer.strategy={STRATEGY_NAME}: "
            "not supported yet; use trainer.strategy=ddp"
        )
    # These two score a version's tokens when its weights leave the engine; with adapters, a turn
    # in flight would otherwise keep sampling on its old adapter after that (`rollout/weights/adapters.py`).
    for cls, name in ((InterruptSyncReference, "interrupt_sync"), (DedicatedReference, "dedicated")):
        if module_lora.serves_adapters and not module_lora.moves_turns and isinstance(reference, cls):
            raise ValueError(
                f"reference={name} with model.lora.push=adapter needs model.lora.in_flight=move "
                f"(turns in flight move to the new adapter at a push), got in_flight={module_lora.in_flight}"
            )


def warn_of_replaced_metrics(trainer: L.Trainer) -> None:
    """Say so when the run's CSV log will replace an earlier run's metrics.csv (Lightning's CSV
    logger deletes it; its own warning, silenced, fires for any non-empty dir)."""
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger) and trainer.is_global_zero:
            metrics = Path(logger.log_dir) / "metrics.csv"
            if metrics.is_file():
                warnings.warn(f"{metrics} holds an earlier run's metrics; this run replaces them", stacklevel=2)


def launch_and_warm_start(
    module: AsyncRLModule, datamodule: RolloutDataModule, warm_start: WarmStart, trainer: L.Trainer, resumed: bool
) -> None:
    """Launch the engines in the background, then run the warm start (not when resuming: a
    checkpoint already holds warmed-up weights).

    Under DDP only rank 0 does either: it hosts the engines, and DDP copies rank 0's weights to
    every rank when it wraps the model, before any hook reads them.
    """
    if trainer.global_rank != 0:
        return
    datamodule.configure_service(trainer)  # the weight route the engines launch with
    # The engines' starts, once their processes exist, overlap the warm start (the last engine's, with several:
    # they are made one at a time).
    datamodule.rollouts.launch_early()
    if not resumed:
        warm_start.run(
            module.policy,
            datamodule.env,
            load_tokenizer(datamodule.model_path),
            log_dir=trainer.log_dir,
            accelerator=trainer.accelerator,
        )
