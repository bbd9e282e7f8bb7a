"""SnapshotRetention: historical scoring by version shard, metrics, and a real Lightning Trainer."""

import copy

import pytest
import torch
from asyncrl_callbacks.snapshot import SnapshotRetention
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, WIDTH, TEMPERATURE = 11, 8, 0.7


class TinyLM(nn.Module):
    """Embedding -> linear -> head, with a non-persistent buffer like rotary ``inv_freq``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("inv_freq", torch.linspace(0.5, 1.5, WIDTH), persistent=False)
        self.calls = 0

    def forward(self, input_ids: Tensor) -> Tensor:
        self.calls += 1
        return self.head(torch.tanh(self.mix(self.embed(input_ids) * self.inv_freq)))  # [B, T, V]


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Log-prob of each token under the tempered distribution at its own position. [B, T]"""
    return (logits / TEMPERATURE).log_softmax(-1).gather(-1, input_ids[..., None]).squeeze(-1)


def scorer(input_ids: Tensor, seen_rows: list | None = None):
    def score(forward, rows):
        if seen_rows is not None:
            seen_rows.append(rows.tolist())
        return token_logprobs(forward(input_ids[rows]), input_ids[rows])

    return score


def step(model: nn.Module, seed: int) -> None:
    """Stand-in for an optimizer step: move every parameter and buffer."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.add_(0.3 * torch.randn(tensor.shape, generator=generator))


def versions_of(model: TinyLM, callback: SnapshotRetention, count: int) -> dict[int, TinyLM]:
    """Save versions 0..count-1, keeping a deep copy of the model at each."""
    copies = {}
    for version in range(count):
        if version:
            step(model, version)
        callback.save_version(version, model)
        copies[version] = copy.deepcopy(model)
    return copies


@pytest.fixture
def batch() -> tuple[Tensor, Tensor, Tensor]:
    torch.manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (3, 4))
    token_versions = torch.tensor([[0, 0, 1, 1], [1, 1, 2, 2], [2, 2, 2, 2]])  # rows {0,1}, {1,2}, {2}
    loss_mask = torch.tensor([[True, True, True, True], [False, True, True, True], [False, True, True, False]])
    return input_ids, token_versions, loss_mask


# ------------------------------------------------------------------------------- historical scoring


def test_one_forward_per_distinct_version_over_its_rows_only(batch):
    input_ids, token_versions, loss_mask = batch
    model, callback = TinyLM(), SnapshotRetention(max_staleness=2)
    versions_of(model, callback, 3)
    model.calls, seen_rows = 0, []
    callback.historical_logprobs(token_versions, loss_mask, scorer(input_ids, seen_rows))
    assert callback.num_historical_forwards == 3 == model.calls
    assert seen_rows == [[0], [0, 1], [1, 2]]  # versions 0, 1, 2 in order
    assert callback.metrics["snapshot/version_shards_per_batch"] == 3
    assert callback.metrics["snapshot/historical_shards_per_batch"] == 2  # 0 and 1; 2 is current
    assert callback.metrics["snapshot/max_staleness_gap"] == 2


def test_historical_logprobs_equal_a_model_kept_at_each_version(batch):
    input_ids, token_versions, loss_mask = batch
    model, callback = TinyLM(), SnapshotRetention(max_staleness=2)
    copies = versions_of(model, callback, 3)
    ref = callback.historical_logprobs(token_versions, loss_mask, scorer(input_ids))
    with torch.no_grad():
        per_version = {v: token_logprobs(m(input_ids), input_ids) for v, m in copies.items()}  # [B, T] each
    expected = torch.zeros(3, 4)
    for b in range(3):
        for t in range(4):
            expected[b, t] = per_version[token_versions[b, t].item()][b, t] if loss_mask[b, t] else 0.0
    torch.testing.assert_close(ref, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(per_version[0], per_version[2])  # the versions really differ
    assert ref[1, 0] == 0 and ref[2, 3] == 0  # unmasked positions are 0


def step_trainable(model: nn.Module, seed: int) -> None:
    """An optimizer step that moves only the parameters that require a gradient."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))


def test_a_frozen_layer_is_not_copied_and_scores_stay_exact(batch):
    # As under a LoRA adapter or with the last layers trained: the frozen layers are shared.
    input_ids, token_versions, loss_mask = batch
    model = TinyLM()
    model.embed.requires_grad_(False)
    callback, copies = SnapshotRetention(max_staleness=2), {}
    for version in range(3):
        if version:
            step_trainable(model, version)
        callback.save_version(version, model)
        copies[version] = copy.deepcopy(model)
    # mix and head (8*8+8 and 8*11+11 floats) and the buffer; not the embedding (11*8).
    assert callback.metrics["snapshot/size_gb"] * 1024**3 == 4 * (72 + 99 + WIDTH)
    assert all("embed.weight" not in callback.store.get(v) for v in range(3))
    ref = callback.historical_logprobs(token_versions, loss_mask, scorer(input_ids))
    with torch.no_grad():
        per_version = {v: token_logprobs(m(input_ids), input_ids) for v, m in copies.items()}
    for b, t in zip(*torch.nonzero(loss_mask, as_tuple=True)):
        assert torch.allclose(ref[b, t], per_version[token_versions[b, t].item()][b, t], atol=1e-6, rtol=0)
    with torch.no_grad():
        model.embed.weight.add_(1.0)  # a frozen tensor written: old snapshots no longer describe their versions
    with pytest.raises(
        ValueError,
        match=r"frozen parameters changed since the snapshot of version 0 was saved \(embed.weight\).*keep=\"all\"",
    ):
        callback.historical_logprobs(token_versions, loss_mask, scorer(input_ids))
    everything = SnapshotRetention(max_staleness=2, keep="all")
    everything.save_version(0, model)
    assert "embed.weight" in everything.store.get(0)


def test_live_module_is_untouched_and_no_gradient_flows(batch):
    input_ids, token_versions, loss_mask = batch
    model, callback = TinyLM(), SnapshotRetention(max_staleness=2)
    versions_of(model, callback, 3)
    step(model, 99)  # live weights move past the newest snapshot
    live = {k: v.clone() for k, v in model.state_dict().items()}
    ref = callback.historical_logprobs(token_versions, loss_mask, scorer(input_ids))
    assert not ref.requires_grad
    assert all(torch.equal(live[k], v) for k, v in model.state_dict().items())


def test_current_logprobs_replace_the_forward_of_the_newest_version(batch):
    input_ids, token_versions, loss_mask = batch
    model, callback = TinyLM(), SnapshotRetention(max_staleness=2)
    versions_of(model, callback, 3)
    current = token_logprobs(model(input_ids), input_ids)  # live weights are version 2, with grad
    ref = callback.historical_logprobs(token_versions, loss_mask, scorer(input_ids), current_logprobs=current)
    assert callback.num_historical_forwards == 2
    assert not ref.requires_grad
    assert torch.equal(ref[2, 1:3], current[2, 1:3].detach())


def test_missing_version_raises_before_any_forward(batch):
    input_ids, token_versions, loss_mask = batch
    model, callback = TinyLM(), SnapshotRetention(max_staleness=2)
    versions_of(model, callback, 3)
    callback.release_unreferenced([0, 2])
    model.calls = 0
    with pytest.raises(KeyError, match=r"version 1 \(resident: \[0, 2\]\)"):
        callback.historical_logprobs(token_versions, loss_mask, scorer(input_ids))
    assert model.calls == 0
    assert callback.has_version(0) and not callback.has_version(1)


def test_release_frees_memory_and_updates_resident_metrics():
    model, callback = TinyLM(), SnapshotRetention(max_staleness=3)
    versions_of(model, callback, 4)
    size = callback.resident_bytes // 4
    assert callback.metrics["snapshot/resident"] == 4
    assert callback.release_unreferenced([1]) == [0, 2]
    assert callback.versions == (1, 3)
    assert callback.resident_bytes == 2 * size
    assert callback.metrics["snapshot/resident_gb"] == pytest.approx(2 * size / 1024**3)
    assert callback.num_released == 2


def test_bf16_storage_halves_size_and_scores_in_the_live_dtype(batch):
    input_ids, token_versions, loss_mask = batch
    torch.manual_seed(0)
    fp32, bf16 = SnapshotRetention(max_staleness=0), SnapshotRetention(max_staleness=0, storage_dtype=torch.bfloat16)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))  # parameters only
    fp32.save_version(0, model)
    bf16.save_version(0, model)
    assert bf16.metrics["snapshot/size_gb"] == fp32.metrics["snapshot/size_gb"] / 2
    versions = torch.zeros_like(token_versions)
    exact = fp32.historical_logprobs(versions, loss_mask, scorer(input_ids))
    rounded = bf16.historical_logprobs(versions, loss_mask, scorer(input_ids))
    assert rounded.dtype == torch.float32
    torch.testing.assert_close(rounded, exact, atol=0.05, rtol=0)
    assert not torch.equal(rounded, exact)  # bf16 storage is approximate, by design


def test_stage_metrics_are_timed(batch):
    input_ids, token_versions, loss_mask = batch
    model, callback = TinyLM(), SnapshotRetention(max_staleness=2)
    versions_of(model, callback, 3)
    callback.historical_logprobs(token_versions, loss_mask, scorer(input_ids))
    metrics = callback.metrics
    assert metrics["snapshot/stage_s"] >= metrics["snapshot/historical_forward_s"] > 0
    assert metrics["snapshot/restore_s"] > 0 and metrics["snapshot/save_s"] > 0
    assert metrics["snapshot/load_s"] == 0  # CPU only: nothing moves between devices


def test_score_fn_of_wrong_shape_is_reported(batch):
    input_ids, token_versions, loss_mask = batch
    model, callback = TinyLM(), SnapshotRetention(max_staleness=2)
    versions_of(model, callback, 3)
    with pytest.raises(ValueError, match=r"shape \(1, 3\) for version 0, expected \(1, 4\)"):
        callback.historical_logprobs(token_versions, loss_mask, lambda forward, rows: torch.zeros(len(rows), 3))


# ------------------------------------------------------------------------------- with a Trainer


class PolicyModule(LightningModule):
    """Scores a batch whose tokens come from the last three versions, like an async run."""

    def __init__(self, snapshots: SnapshotRetention | None = None) -> None:
        super().__init__()
        self.policy = TinyLM()
        self.snapshots = snapshots
        self.copies: dict[int, TinyLM] = {}
        self.errors: list[float] = []

    def on_train_start(self) -> None:
        self.copies[self.global_step] = copy.deepcopy(self.policy)

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        (input_ids,) = batch
        current = self.global_step
        logprobs = token_logprobs(self.policy(input_ids), input_ids)
        if self.snapshots is not None:
            self._check_reference(input_ids, current)
            self.snapshots.release_unreferenced([current - 1, current])  # what the buffer still holds
        return -logprobs.mean()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:  # runs after the callbacks' hook
        self.copies[self.global_step] = copy.deepcopy(self.policy)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def _check_reference(self, input_ids: Tensor, current: int) -> None:
        row_versions = [max(current - b % 3, 0) for b in range(len(input_ids))]  # row b: version current - b % 3
        token_versions = torch.tensor(row_versions)[:, None].expand_as(input_ids)
        mask = torch.ones_like(input_ids, dtype=torch.bool)
        ref = self.snapshots.historical_logprobs(token_versions, mask, scorer(input_ids))
        with torch.no_grad():  # each row alone, through the copy kept at its version
            rows = [input_ids[b, None] for b in range(len(input_ids))]
            expected = torch.cat([token_logprobs(self.copies[v](row), row) for v, row in zip(row_versions, rows)])
        self.errors.append((ref - expected).abs().max().item())


def fit(module: LightningModule, callback: SnapshotRetention, steps: int, tmp_path, ckpt_path=None) -> Trainer:
    torch.manual_seed(2)
    data = DataLoader(TensorDataset(torch.randint(0, VOCAB, (32, 5))), batch_size=4)
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer


def test_trainer_saves_versions_zero_to_n(tmp_path):
    callback = SnapshotRetention(max_staleness=3, module_attr="policy")
    module = PolicyModule()
    trainer = fit(module, callback, 3, tmp_path)
    assert callback.versions == (0, 1, 2, 3)
    assert callback.num_saved == 4
    for version, kept in module.copies.items():
        snapshot = callback.store.get(version)
        assert all(torch.equal(snapshot[name], tensor) for name, tensor in dict(kept.named_parameters()).items())
    assert trainer.callback_metrics["snapshot/resident"] == 4
    # One snapshot holds every parameter and buffer of the policy once (what a functional call of it
    # needs), in its own dtype; four are resident.
    tensors = [*module.policy.parameters(), *module.policy.buffers()]
    snapshot_bytes = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    assert callback.resident_bytes == 4 * snapshot_bytes
    assert trainer.callback_metrics["snapshot/size_gb"] == pytest.approx(snapshot_bytes / 1024**3)


def test_trainer_step_scores_exact_old_logprobs_and_releases(tmp_path):
    callback = SnapshotRetention(max_staleness=2, module_attr="policy", max_resident=3)
    module = PolicyModule(callback)
    trainer = fit(module, callback, 4, tmp_path)
    assert len(module.errors) == 4 and max(module.errors) < 1e-6
    # Step 4 released everything but 2 and 3; then saving 4 kept the newest.
    assert callback.versions == (2, 3, 4)
    # Versions at step v are {v, v-1, v-2} clamped at 0: 1, 2, 3, 3 shards, one forward each.
    assert callback.num_historical_forwards == 1 + 2 + 3 + 3
    assert trainer.callback_metrics["snapshot/version_shards_per_batch"] == 3
    assert trainer.callback_metrics["snapshot/max_staleness_gap"] == 2


def test_trainer_fails_before_the_first_step_when_max_bytes_is_too_small(tmp_path):
    module = PolicyModule()
    callback = SnapshotRetention(max_staleness=3, module_attr="policy", max_bytes=1000)
    with pytest.raises(ValueError, match="max_bytes=1000"):
        fit(module, callback, 2, tmp_path)
    assert module.global_step == 0 and not module.copies  # raised in on_train_start, before the module's hook


def test_module_attr_must_name_a_module(tmp_path):
    with pytest.raises(AttributeError, match="module_attr='actor'"):
        fit(PolicyModule(), SnapshotRetention(max_staleness=1, module_attr="actor"), 1, tmp_path)


@pytest.mark.parametrize("checkpoint_snapshots", [False, True])
def test_resume_restores_counters_and_optionally_the_snapshots(tmp_path, checkpoint_snapshots):
    first = SnapshotRetention(max_staleness=3, module_attr="policy", checkpoint_snapshots=checkpoint_snapshots)
    trainer = fit(PolicyModule(), first, 2, tmp_path)
    ckpt = tmp_path / "step2.ckpt"
    trainer.save_checkpoint(ckpt)
    has_snapshots = any(key.startswith("snapshots/") for key in torch.load(ckpt, weights_only=False))
    assert has_snapshots == checkpoint_snapshots

    second = SnapshotRetention(max_staleness=3, module_attr="policy", checkpoint_snapshots=checkpoint_snapshots)
    fit(PolicyModule(), second, 3, tmp_path, ckpt_path=ckpt)
    assert second.num_saved == 3 + 2  # 3 before the checkpoint, then 2 (resumed version) and 3
    assert second.versions == ((0, 1, 2, 3) if checkpoint_snapshots else (2, 3))
    if checkpoint_snapshots:
        assert all(torch.equal(second.store.get(v)[k], t) for v in (0, 1) for k, t in first.store.get(v).items())
