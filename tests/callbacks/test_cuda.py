"""The reusable callbacks on a CUDA device, in a plain Lightning project (skipped without a GPU).

What only a GPU exercises: snapshots copied into pinned host memory with asynchronous copies (a missing
synchronisation would let the next optimizer step's values into the host copy), the copy back before a
historical forward, bf16 storage converted on the way out, the EWMA's fused lerp on device tensors, and
both restored from a checkpoint onto the device. Each value is checked against an oracle kept by the test:
a deep copy of the model at every version, scored in eval mode (the GPT-2-shaped model has dropout 0.1).
"""

import copy

import pytest
import torch
from asyncrl_callbacks import EWMAReference, SnapshotRetention
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

VOCAB, LENGTH, BETA = 97, 12, 0.5


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    return logits.float().log_softmax(-1).gather(-1, input_ids[..., None]).squeeze(-1)


class Agent(LightningModule):
    """Trains a dropout GPT-2 and checks, inside every step, pi_old and the EWMA reference against its copies."""

    def __init__(self, snapshots: SnapshotRetention, ewma: EWMAReference) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.policy = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=4))
        self.snapshots, self.ewma = snapshots, ewma
        self.copies: dict[int, GPT2LMHeadModel] = {}
        self.pi_old_errors: list[float] = []
        self.ewma_errors: list[float] = []

    def configure_callbacks(self):
        return [self.snapshots, self.ewma]

    def on_train_start(self) -> None:
        self.copies[self.global_step] = copy.deepcopy(self.policy).eval()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:  # after the callbacks' hooks
        self.copies[self.global_step] = copy.deepcopy(self.policy).eval()

    def training_step(self, batch, batch_idx):
        (input_ids,) = batch
        assert self.policy.training  # the live forward keeps its dropout
        logprobs = token_logprobs(self.policy(input_ids).logits, input_ids)
        self._check_pi_old(input_ids)
        self._check_ewma(input_ids)
        self.snapshots.release_unreferenced(range(self.global_step - 2, self.global_step + 1))
        return -logprobs.mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)

    @torch.no_grad()
    def _check_pi_old(self, input_ids: torch.Tensor) -> None:
        current = self.global_step
        row_versions = [max(current - row % 3, 0) for row in range(len(input_ids))]
        token_versions = torch.tensor(row_versions, device=self.device)[:, None].expand_as(input_ids)
        mask = torch.ones_like(input_ids, dtype=torch.bool)

        def score(forward, rows):
            return token_logprobs(forward(input_ids[rows]).logits, input_ids[rows])

        pi_old = self.snapshots.historical_logprobs(token_versions, mask, score)
        assert pi_old.device.type == "cuda"
        expected = torch.cat(
            [token_logprobs(self.copies[v](input_ids[[b]]).logits, input_ids[[b]]) for b, v in enumerate(row_versions)]
        )
        self.pi_old_errors.append((pi_old - expected).abs().max().item())

    @torch.no_grad()
    def _check_ewma(self, input_ids: torch.Tensor) -> None:
        # theta_prox after k updates is sum_v beta^(k-v) theta_v / sum_v beta^(k-v) over versions 0..k.
        versions = sorted(self.copies)
        weights = [BETA ** (versions[-1] - v) for v in versions]
        average = copy.deepcopy(self.copies[versions[-1]])
        for name, parameter in average.named_parameters():
            stacked = torch.stack([dict(self.copies[v].named_parameters())[name].double() for v in versions])
            weight = torch.tensor(weights, dtype=torch.float64, device=stacked.device).view(
                -1, *[1] * (stacked.dim() - 1)
            )
            parameter.copy_((weight * stacked).sum(0) / sum(weights))
        reference = token_logprobs(self.ewma.reference_forward(input_ids).logits, input_ids)
        self.ewma_errors.append((reference - token_logprobs(average(input_ids).logits, input_ids)).abs().max().item())


def fit(agent: Agent, steps: int, root, ckpt_path=None) -> Trainer:
    data = torch.randint(0, VOCAB, (64, LENGTH), generator=torch.Generator().manual_seed(1))
    trainer = Trainer(
        accelerator="gpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
    )  # fmt: skip
    trainer.fit(agent, DataLoader(TensorDataset(data), batch_size=6), ckpt_path=ckpt_path)
    return trainer


def callbacks(storage_dtype=None) -> tuple[SnapshotRetention, EWMAReference]:
    snapshots = SnapshotRetention(
        max_staleness=2, module_attr="policy", storage_dtype=storage_dtype, checkpoint_snapshots=True
    )
    return snapshots, EWMAReference(beta=BETA, module_attr="policy", patience=None)  # no reset: the oracle averages all


def test_pinned_snapshots_and_the_ewma_match_copies_of_the_model_at_every_step_and_after_a_resume(tmp_path):
    snapshots, ewma = callbacks()
    agent = Agent(snapshots, ewma)
    trainer = fit(agent, 6, tmp_path)
    assert len(agent.pi_old_errors) == 6 and max(agent.pi_old_errors) < 1e-5, agent.pi_old_errors
    assert max(agent.ewma_errors) < 1e-5, agent.ewma_errors
    for version in snapshots.versions:  # the host copies hold exactly the weights of their version
        host = snapshots.store.get(version)
        assert all(t.device.type == "cpu" and t.is_pinned() for t in host.values())
        kept = dict(agent.copies[version].named_parameters())
        assert all(torch.equal(host[name], kept[name].cpu()) for name in kept if name in host)
    assert all(p.device.type == "cuda" for p in ewma.averaged_parameters.values())
    checkpoint = tmp_path / "step6.ckpt"
    trainer.save_checkpoint(checkpoint)

    # Resumed in a fresh process's objects: the snapshots come back pinned, the average onto the GPU.
    restored_snapshots, restored_ewma = callbacks()
    resumed = Agent(restored_snapshots, restored_ewma)
    resumed.copies = dict(agent.copies)  # the average holds versions 0-6: its oracle needs them all
    fit(resumed, 9, tmp_path, ckpt_path=checkpoint)
    assert len(resumed.pi_old_errors) == 3 and max(resumed.pi_old_errors) < 1e-5, resumed.pi_old_errors
    assert max(resumed.ewma_errors) < 1e-5, resumed.ewma_errors
    for version in restored_snapshots.versions:
        assert all(t.device.type == "cpu" and t.is_pinned() for t in restored_snapshots.store.get(version).values())
    assert all(p.device.type == "cuda" for p in restored_ewma.averaged_parameters.values())


def test_bf16_storage_holds_each_versions_weights_rounded_once(tmp_path):
    snapshots, ewma = callbacks(storage_dtype="bfloat16")
    agent = Agent(snapshots, ewma)
    fit(agent, 3, tmp_path)
    for version in snapshots.versions:
        host, kept = snapshots.store.get(version), dict(agent.copies[version].named_parameters())
        assert all(
            torch.equal(host[name], kept[name].detach().cpu().to(torch.bfloat16)) for name in kept if name in host
        )
    # pi_old from rounded weights is no longer exact, but close: bf16 keeps 8 bits of mantissa.
    assert 0 < max(agent.pi_old_errors[1:]) < 0.05, agent.pi_old_errors
