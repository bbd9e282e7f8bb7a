"""AsyncRLModule.training_step through a real Lightning Trainer on hand-made batches (no engine).

The module pulls its own batch (`training_step(dataloader_iter)`) and its `configure_callbacks`
adds EngineWeightSync and RolloutStatsLogger, which find the rollout service as the datamodule's
`rollouts`: here a fake that records every call. Every expected value is computed by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_asyncrl.losses import PPOClip
from lit_asyncrl.module import AsyncRLModule
from tests.support.batches import all_version, make_batch, own_logprobs
from tests.support.fakes import FakeRollouts
from tests.support.lightning import ListDataModule, PlainDataModule, RecordingLogger, StepMetrics, make_trainer

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*does not have many workers.*",
    "ignore:.*GPU available but not used.*",
    "ignore:.*dataloader_iter.*",
    "ignore:.*LeafSpec.*",
)


def test_one_step_on_policy_batch_pushes_weights_and_logs_hand_values():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClip(), lr=1e-3)
    # mu = the policy's own log-probs: the ratio pi_theta / mu is 1 on every policy token.
    own = own_logprobs(module)
    batch = make_batch(all_version(0), success=[1.0, 0.0, 1.0, 1.0], behavior=own)
    weight_names = sorted(module.policy.state_dict())
    rollouts = FakeRollouts()
    recorder = StepMetrics()
    trainer = make_trainer(1, [recorder])
    trainer.fit(module, datamodule=ListDataModule([batch], rollouts))

    assert trainer.global_step == 1
    # start at train start with version 0, one publish of version 1 after the step; both with the policy's weights.
    lifecycle = [call for call in rollouts.calls if call[0] in ("start", "publish")]
    assert lifecycle == [("start", 0, weight_names), ("publish", 1, weight_names)]
    assert ("stats",) in rollouts.calls
    assert not any(call[0] in ("pause", "resume", "score_unscored", "use_dedicated_worker") for call in rollouts.calls)

    (metrics,) = recorder.per_step
    # success [1, 0, 1, 1] -> 3/4
    assert metrics["train/task_success"] == pytest.approx(0.75)
    # all 8 policy tokens sampled by version 0, trainer at version 0: every gap is 0.
    assert metrics["train/version_gap_max"] == 0.0
    assert metrics["train/version_gap_mean"] == 0.0
    assert metrics["train/policy_tokens"] == 8.0
    # ratio 1 everywhere, inside the clip: loss = -(token mean of A) = -(3 + 2 - 1 - 2) / 8 = -0.25
    assert metrics["train/loss"] == pytest.approx(-0.25, abs=1e-6)
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["train/ppo_clip_ratio"] == 0.0
    # rewards [1, 0, 0, -0.2] -> 0.8 / 4
    assert metrics["train/reward"] == pytest.approx(0.2)
    # RolloutStatsLogger (a module callback, so it runs after the recorder) logs the service's stats as they are.
    final = {key: float(value) for key, value in trainer.callback_metrics.items()}
    assert final["rollout/queue_depth"] == 7.0
    assert final["rollout/tokens_per_s"] == 12.5
    # the fake's publish returns no timings: nothing about the push is logged.
    assert "rollout/weight_push_s" not in final


def test_version_gaps_are_trainer_version_minus_token_versions():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClip(), lr=1e-3)
    # Step s trains at trainer version s (optimizer steps taken so far).
    step0 = make_batch(all_version(0), success=[0.0, 0.0, 0.0, 1.0])  # gaps all 0
    step1 = make_batch({0: [0, 1, 1], 1: [1, 1], 2: [1], 3: [0, 0]}, success=[1.0, 1.0, 0.0, 0.0])
    # step 1 gaps: row0 [1,0,0], row1 [0,0], row2 [0], row3 [1,1] -> sum 3 over 8 tokens, max 1
    step2 = make_batch({0: [0, 1, 2], 1: [2, 2], 2: [0], 3: [1, 2]}, success=[1.0, 1.0, 1.0, 0.0])
    # step 2 gaps: row0 [2,1,0], row1 [0,0], row2 [2], row3 [1,0] -> sum 6 over 8 tokens, max 2
    rollouts = FakeRollouts()
    recorder, logger = StepMetrics(), RecordingLogger()
    trainer = make_trainer(3, [recorder], logger=logger)
    trainer.fit(module, datamodule=ListDataModule([step0, step1, step2], rollouts))

    assert trainer.global_step == 3
    publishes = [call[1] for call in rollouts.calls if call[0] == "publish"]
    starts = [call[1] for call in rollouts.calls if call[0] == "start"]
    assert starts == [0] and publishes == [1, 2, 3]
    gaps = [(m["train/version_gap_mean"], m["train/version_gap_max"]) for m in recorder.per_step]
    assert gaps == [(0.0, 0.0), (pytest.approx(3 / 8), 1.0), (pytest.approx(6 / 8), 2.0)]
    # task success is the mean of each step's own batch, not a running mean over steps
    assert [m["train/task_success"] for m in recorder.per_step] == [
        pytest.approx(0.25),
        pytest.approx(0.5),
        pytest.approx(0.75),
    ]
    # per-gap buckets of the loss metrics at step 2: gap 0 on row0 x1, row1 x2, row3 x1 -> 4;
    # gap 1 on row0, row3 -> 2; gap 2 on row0, row2 -> 2
    last = logger.keys_at(2)
    assert last["train/policy_tokens/gap_0"] == 4.0
    assert last["train/policy_tokens/gap_1"] == 2.0
    assert last["train/policy_tokens/gap_2"] == 2.0
    # A bucket without tokens in a step is absent from that step's rows, never a repeated old value.
    assert not any(key.endswith(("/gap_1", "/gap_2")) for key in logger.keys_at(0))
    assert logger.keys_at(1)["train/policy_tokens/gap_1"] == 3.0 and "train/policy_tokens/gap_2" not in logger.keys_at(
        1
    )


@pytest.mark.parametrize(
    "missing", ["configure", "next_batch", "publish_weights", "live_versions", "state_dict", "close"]
)
def test_a_service_missing_part_of_the_protocol_is_refused_naming_who_needs_it(missing):
    from types import SimpleNamespace

    from lit_asyncrl.trainer_callbacks.find import rollouts_of

    incomplete = type("Incomplete", (FakeRollouts,), {missing: None})()
    trainer = SimpleNamespace(datamodule=SimpleNamespace(rollouts=incomplete))
    with pytest.raises(TypeError, match="^EngineWeightSync needs a rollout service"):
        rollouts_of(trainer, "EngineWeightSync")
    assert (
        rollouts_of(SimpleNamespace(datamodule=SimpleNamespace(rollouts=FakeRollouts())), "EngineWeightSync")
        is not None
    )


def test_the_module_trains_on_any_datamodule_that_yields_the_schema():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClip(), lr=1e-3)
    before = module.policy.model.embed_tokens.weight.detach().clone()
    metrics = StepMetrics()
    trainer = make_trainer(2, [metrics])
    trainer.fit(
        module,
        datamodule=PlainDataModule(
            [make_batch(all_version(0), [1.0, 0.0, 0.0, 0.0]), make_batch(all_version(0), [1.0, 1.0, 0.0, 0.0])]
        ),
    )
    assert trainer.global_step == 2
    assert [step["train/task_success"] for step in metrics.per_step] == [0.25, 0.5]
    assert not torch.equal(module.policy.model.embed_tokens.weight, before)  # it did train


def test_a_mixtures_batches_log_training_success_per_task_present():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClip(), lr=1e-3)
    names = ("desk", "desk_customer", "guess_number")
    # Step 1: rows 0-1 desk, rows 2-3 the game; step 2: rows 0-1 the desk with a customer, rows 2-3 the desk.
    first = {
        **make_batch(all_version(0), [1.0, 0.0, 1.0, 1.0]),
        "task_ids": torch.tensor([0, 0, 2, 2]),
        "task_names": names,
    }
    second = {
        **make_batch(all_version(1), [0.0, 0.0, 1.0, 0.0]),
        "task_ids": torch.tensor([1, 1, 0, 0]),
        "task_names": names,
    }
    logger = RecordingLogger()
    trainer = make_trainer(2, [], logger=logger)
    trainer.fit(module, datamodule=PlainDataModule([first, second]))
    per_task = [
        {
            key: value
            for key, value in logger.keys_at(step).items()
            if key.endswith("/task_success") and key.count("/") == 2
        }
        for step in (0, 1)
    ]
    # A task without an episode in a step has no value in that step's row.
    assert per_task[0] == {"train/desk/task_success": 0.5, "train/guess_number/task_success": 1.0}
    assert per_task[1] == {"train/desk_customer/task_success": 0.0, "train/desk/task_success": 0.5}


def test_non_finite_mu_from_the_engine_is_masked_and_counted_and_the_loss_stays_finite():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClip(), lr=1e-3)
    broken = own_logprobs(module).clone()
    broken[0, 3], broken[2, 3], broken[3, 1] = math.nan, math.inf, -math.inf  # three of the 8 policy tokens
    before = {name: tensor.clone() for name, tensor in module.policy.state_dict().items()}
    recorder = StepMetrics()
    trainer = make_trainer(1, [recorder])
    trainer.fit(
        module,
        datamodule=ListDataModule(
            [make_batch(all_version(0), success=[1.0, 0.0, 1.0, 1.0], behavior=broken)], FakeRollouts()
        ),
    )

    (metrics,) = recorder.per_step
    assert metrics["train/nonfinite_tokens"] == 3.0
    assert metrics["train/policy_tokens"] == 5.0  # the loss's count: the finite ones
    assert math.isfinite(metrics["train/loss"])
    # ratio 1 on the 5 finite tokens: loss = -(mean A over them) = -(1 + 1 + 1 + 1 - 1) / 5 = -0.6
    assert metrics["train/loss"] == pytest.approx(-0.6, abs=1e-6)
    after = module.policy.state_dict()
    assert all(torch.isfinite(tensor).all() for tensor in after.values())
    assert any(not torch.equal(before[name], after[name]) for name in before)  # it still learned from the rest


def test_the_silent_current_reference_warning_spares_ewma_right_after_a_reset():
    import warnings

    from lit_asyncrl.reference import AsyncRecomputeReference, EWMAReferenceSource

    current = torch.full((1, 3), -1.0)
    gap, mask = torch.tensor([[0, 1, 2]]), torch.ones(1, 3, dtype=torch.bool)
    recompute = AsyncRLModule(loss=PPOClip(), reference=AsyncRecomputeReference())
    with pytest.warns(UserWarning, match="r_s == 1 for every token"):
        recompute._warn_if_reference_is_silently_current(current.clone(), current, gap, mask)
    # An EWMA average equals the live weights by design from an attach or reset to the next update ...
    reference = EWMAReferenceSource(beta=0.75)
    ewma = AsyncRLModule(loss=PPOClip(), reference=reference)
    reference.callbacks()[0].attach(ewma.policy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ewma._warn_if_reference_is_silently_current(current.clone(), current, gap, mask)
    # ... but an average that has folded in an update and still gives the live log-probs is suspect.
    reference.callbacks()[0].update()
    with pytest.warns(UserWarning, match="EWMAReferenceSource gives the current weights"):
        ewma._warn_if_reference_is_silently_current(current.clone(), current, gap, mask)


def test_a_dataset_tasks_reward_functions_are_logged_each_where_they_scored():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClip(), lr=1e-3)
    nan = float("nan")
    batch = {
        **make_batch(all_version(0), [1.0, 0.0, 1.0, 1.0]),
        "reward_value/exact_match": torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64),
        "reward_failed/exact_match": torch.zeros(4, dtype=torch.float64),
        "reward_value/short": torch.tensor([0.5, nan, nan, -1.5], dtype=torch.float64),
        "reward_failed/short": torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64),
    }
    logger = RecordingLogger()
    trainer = make_trainer(1, [], logger=logger)
    trainer.fit(module, datamodule=PlainDataModule([batch]))
    rewards = {key: value for key, value in logger.keys_at(0).items() if key.startswith("train/rewards/")}
    # exact_match: mean of 1, 0, 1, 1; short: mean of 0.5 and -1.5 where it scored (2 of 4), raised on 1 of 4.
    assert rewards == {
        "train/rewards/exact_match": 0.75,
        "train/rewards/exact_match/scored": 1.0,
        "train/rewards/exact_match/failed": 0.0,
        "train/rewards/short": -0.5,
        "train/rewards/short/scored": 0.5,
        "train/rewards/short/failed": 0.25,
    }


class HeldOutDataModule(PlainDataModule):
    """Ready-made training batches and, at each validation, one held-out chunk: 2 instances x 2 samples."""

    def val_dataloader(self):
        chunk = {"success": torch.tensor([[1.0, 0.0], [1.0, 1.0]]), "greedy_success": torch.tensor([1.0, 0.0]), "k": 2}
        return torch.utils.data.DataLoader([chunk], batch_size=None, num_workers=0)


def test_a_first_validation_after_training_steps_logs_the_held_out_metrics():
    # Without an evaluation before RL (num_sanity_val_steps=0), the held-out metrics are made after the
    # training steps logged theirs; Lightning must still find each one's attribute.
    module = AsyncRLModule(loss=PPOClip(), lr=1e-3)
    trainer = make_trainer(2, [], val_check_interval=2, num_sanity_val_steps=0)
    batches = [make_batch(all_version(0), [1.0, 0.0, 0.0, 0.0]), make_batch(all_version(0), [1.0, 1.0, 0.0, 0.0])]
    trainer.fit(module, datamodule=HeldOutDataModule(batches))

    # avg@2: (1/2 + 2/2) / 2; pass@2: both instances solved once; greedy: 1 of 2.
    assert float(trainer.callback_metrics["val/avg@2"]) == 0.75
    assert float(trainer.callback_metrics["val/pass@2"]) == 1.0
    assert float(trainer.callback_metrics["val/greedy_success"]) == 0.5
