"""A bare CPU trainer and a per-step metrics recorder, shared by the engine-free unit tests."""

import lightning as L


class StepMetrics(L.Callback):
    """Copies the trainer's callback metrics at the end of each training batch."""

    def __init__(self) -> None:
        self.per_step: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.per_step.append({key: float(value) for key, value in trainer.callback_metrics.items()})


def make_trainer(max_steps: int, callbacks: list[L.Callback]) -> L.Trainer:
    """One CPU device, nothing written to disk, nothing printed."""
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
