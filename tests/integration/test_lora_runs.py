"""LoRA adapters as versions in real runs: the engine serves each version as a vLLM adapter, the
snapshot route's old log-probs stay exact, only the adapter trains, and a resume serves the
checkpoint's adapter."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path
from tests.support.reference_checks import check_exact_route
from tests.support.runs import STALE_RUN, read_rows, run_hydra

pytestmark = pytest.mark.engine
LORA_RUN = [
    "experiment=snapshot",
    "model.lora.rank=8",
    *[o for o in STALE_RUN if not o.startswith("trainer.max_steps")],
]
#: rank 8 on the tiny policy's 7 projections of 2 layers: 8 * (in + out) each, fp32
#: (q 128+128, k 128+64, v 128+64, o 128+128, gate 128+256, up 128+256, down 256+128).
ADAPTER_BYTES = 4 * 2 * 8 * (256 + 192 + 192 + 256 + 384 + 384 + 384)


def test_adapter_versions_under_ddp_are_exact_only_the_adapter_trains_and_a_resume_serves_its_adapter(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    # The probe, and the final checkpoint the resume starts from (the list replaces conf/trainer's).
    final = f"{{_target_:lightning.pytorch.callbacks.ModelCheckpoint,dirpath:'{first}/checkpoints',filename:last,save_on_train_epoch_end:true}}"
    probe = f"trainer.callbacks=[{{_target_:tests.integration.ddp_probe.RankProbe,out_dir:'{tmp_path}/probe'}},{final}]"
    ddp = ["trainer.devices=2", "trainer.strategy=ddp", probe]
    run_hydra([*LORA_RUN, "trainer.max_steps=8", "fidelity=true", *ddp, f"hydra.run.dir={first}"])
    # Every token's mu (sampled under its version's adapter, a turn in flight at a push keeping
    # its own) equals the trainer's log-prob at that version, stale tokens included ...
    rows = check_exact_route(first)
    assert ADAPTER_BYTES == 131_072
    assert [row["rollout/weight_push_bytes"] for row in rows] == [ADAPTER_BYTES] * 8  # rank 0 pushes once per version
    # ... on both ranks, whose adapters DDP keeps equal (their gradients all-reduced).
    ranks = [torch.load(tmp_path / "probe" / f"rank{rank}.pt") for rank in (0, 1)]
    for state in ranks:
        assert len(state["step_metrics"]) == 8
        assert all(step["train/ref_behavior_logratio_absmax"] < 1e-4 for step in state["step_metrics"])
    adapter = {name for name in ranks[0]["live"] if ".lora_" in name}
    assert len(adapter) == 28
    for name, tensor in ranks[0]["live"].items():
        assert torch.equal(tensor, ranks[1]["live"][name]), name

    # Only the adapter trained: every base weight of the trained policy is the model folder's ...
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(None), dtype=torch.float32).state_dict()
    live = ranks[0]["live"]
    checked = 0
    for name, tensor in base.items():
        layer, _, kind = name.rpartition(".")
        for key in (
            k for k in (f"base_model.model.{name}", f"base_model.model.{layer}.base_layer.{kind}") if k in live
        ):
            assert torch.equal(live[key], tensor), key
            checked += 1
    assert checked == len(base) - 1  # all but the tied head, which is the embedding
    assert all(live[name].abs().max() > 0 for name in adapter if ".lora_B." in name)  # peft starts B at 0
    # ... so the checkpoint holds the adapter alone, and the resume takes the base from that folder.
    saved = torch.load(first / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert sorted(saved["state_dict"]) == sorted(f"policy.{name}" for name in adapter)
    assert saved["frozen_parameters_from"] == "None"  # the built-in tiny policy (model.path=null)

    resume_probe = (
        f"trainer.callbacks=[{{_target_:tests.integration.resume_probe.ResumeProbe,out_dir:'{tmp_path}/probe'}}]"
    )
    checkpoint = f"ckpt_path='{first / 'checkpoints' / 'last.ckpt'}'"
    run_hydra([*LORA_RUN, "trainer.max_steps=11", checkpoint, resume_probe, f"hydra.run.dir={second}"])
    resumed = read_rows(second / "metrics.csv")
    assert [row["step"] for row in resumed] == [8, 9, 10]
    # Before its first step the resumed run holds the checkpoint's adapter, bit for bit, and the
    # engine serves it: on a fixed prompt its mu equals the trainer's log-probs (fp32 engine).
    probe = torch.load(tmp_path / "probe" / "resumed.pt")
    assert probe["global_step"] == 8 and probe["versions"] == [8] * len(probe["versions"])
    assert sorted(probe["adapter"]) == sorted(name.removeprefix("policy.") for name in saved["state_dict"])
    for name, tensor in probe["adapter"].items():
        assert torch.equal(tensor, saved["state_dict"][f"policy.{name}"]), name
    assert (probe["engine_logprobs"] - probe["trainer_logprobs"]).abs().max() < 1e-4  # measured 4.8e-7
    assert (probe["base_logprobs"] - probe["trainer_logprobs"]).abs().max() > 1e-2  # without the adapter: 0.35
    # Every token after the resume is scored exactly: the episodes pending at the checkpoint (trained
    # first) and the answered turns of those in flight (replayed) by the checkpointed snapshots of
    # their versions' adapters, the new tokens by the checkpoint's adapter, which the engine served:
    # a wrong version or mu on any token would show here (> 1e-2).
    service = saved["RolloutDataModule"]["rollout_service"]
    assert service["accounting"]["pending"] == resumed[0]["rollout/restored"] > 0
    assert resumed[0]["rollout/restored_trained"] > 0 and resumed[0]["rollout/dropped_restart"] == 0
    assert resumed[-1].get("rollout/resumed_in_flight", 0) == 4 * len(service["in_flight"])
    for row in resumed:
        assert row["train/ref_behavior_logratio_absmax"] < 1e-4
        assert row["rollout/weight_push_bytes"] == ADAPTER_BYTES


def test_interrupt_sync_and_the_dedicated_worker_with_adapters_are_exact_in_real_runs(tmp_path):
    # With `model.lora.in_flight=move` a turn in flight at a push moves to the new adapter, so each
    # version's tokens all exist when its adapter leaves: interruption-sync scores them with the live
    # adapter before the step, the dedicated worker (the base model with the adapter of its version)
    # before it loads the next; both exact at every gap, and the fidelity shadow agrees within 1e-5.
    from tests.support.reference_checks import check_dedicated, check_interrupt_sync

    experiments = ["interrupt_sync", "dedicated"]
    lora = ["model.lora.rank=8", "model.lora.in_flight=move", "fidelity=true"]
    # Room for far more episodes than the run trains keeps the engine generating through every push
    # (episodes past the version gap leave as dropped_stale): with room for two batches it refilled
    # the buffer during a step and stood idle at each push whenever it sampled faster than the
    # trainer stepped, so no turn was there to move (measured: 0 in all 8 pushes of both runs;
    # with this room 25 to 32 turns moved at every push, the queue at most 244 deep).
    always_generating = [o for o in STALE_RUN if not o.startswith("rollout.buffer_capacity")]
    always_generating.append("rollout.buffer_capacity=1024")
    sweep = ["-m", f"experiment={','.join(experiments)}", *lora, *always_generating, f"hydra.sweep.dir={tmp_path}"]
    run_hydra(sweep, timeout_s=900)
    for job, experiment in enumerate(experiments):
        run_dir = next(tmp_path.glob(f"{job}_experiment={experiment},*"))
        (check_interrupt_sync if experiment == "interrupt_sync" else check_dedicated)(run_dir)
        rows = read_rows(run_dir / "metrics.csv")
        assert [row["rollout/weight_push_bytes"] for row in rows] == [ADAPTER_BYTES] * 8
        assert sum(row["rollout/moved_turns"] for row in rows) > 0  # turns were in flight at pushes, and moved
