"""A callback a resumed run adds: at its first step, before any training, the live adapter and the
engine's log-probs on a fixed prompt beside the trainer's, saved to `<out_dir>/resumed.pt`."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from lit_asyncrl.scoring import token_logprobs

#: A fixed prompt of the tiny policy's vocabulary and the tokens sampled after it.
PROMPT, SAMPLED_TOKENS = [1, 17, 42, 5, 9], 24


class ResumeProbe(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.done = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        # The engine is up (a batch came from it) and no step of this run has changed the adapter.
        if self.done:
            return
        self.done = True
        engine = trainer.datamodule.rollouts.engine
        turn = engine.run(
            engine.generate(PROMPT, max_tokens=SAMPLED_TOKENS, temperature=1.0, ignore_eos=True), timeout_s=120
        )
        policy = pl_module.policy
        ids = torch.tensor([PROMPT + turn.token_ids])
        was_training = policy.training
        policy.eval()
        with torch.no_grad():
            trainer_logprobs = token_logprobs(policy, ids, torch.ones_like(ids), 1.0)[0, len(PROMPT) :]
            with policy.disable_adapter():  # the base model alone: what a lost adapter would serve
                base_logprobs = token_logprobs(policy, ids, torch.ones_like(ids), 1.0)[0, len(PROMPT) :]
        policy.train(was_training)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "global_step": trainer.global_step,
                "adapter": {
                    name: tensor.detach().clone() for name, tensor in policy.named_parameters() if ".lora_" in name
                },
                "versions": turn.versions,
                "engine_logprobs": torch.tensor(turn.logprobs),
                "trainer_logprobs": trainer_logprobs,
                "base_logprobs": base_logprobs,
            },
            self.out_dir / "resumed.pt",
        )
