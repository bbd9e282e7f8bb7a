"""Scale-out on the real parts: two vLLM engines, and two DDP training processes (gloo) on them."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_asyncrl.rollout.processes.temp_dirs import ray_root
from tests.support.exports import assert_exported_equal, exported_tensors
from tests.support.runs import REPO, SMALL_RUN, STALE_RUN, read_all_rows, run_hydra

pytestmark = pytest.mark.engine
#: The Ray tests look for Ray processes left behind: one at a time, on one worker.
one_ray_test_at_a_time = pytest.mark.xdist_group("ray")
STEPS = 6
GROUP_SIZE, GROUPS_PER_BATCH = 4, 4  # SMALL_RUN's
TASKS = ("desk", "desk_customer", "guess_number")  # conf/env/mixture.yaml's tasks, in order


def assert_accounting_holds(row: dict[str, float]) -> None:
    """Every produced episode is trained, dropped with a reason or pending, exactly once."""
    assert row["rollout/produced"] == row["rollout/trained"] + row["rollout/dropped"] + row["rollout/pending"]


def assert_both_engines_generated(rows: list[dict[str, float]], steps: int) -> None:
    last = [row for row in rows if "rollout/engine_version" in row][-1]  # the last step's (a validation may follow)
    assert last["rollout/engine_0/groups_started"] >= 2 and last["rollout/engine_1/groups_started"] >= 2
    # Every version reached every engine: the older engine version is the trainer's newest.
    assert last["rollout/engine_version"] == steps


def ray_processes() -> list[str]:
    """Command lines of Ray's own processes (its GCS server, raylet and workers) now running."""
    names = ("gcs_server", "raylet", "ray::")
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(name in text for name in names):
            found.append(text)
    return found


# Ray placement: each engine a Ray actor asking for half a CPU, on a Ray instance the run starts.
RAY = ["rollout.placement=ray", "rollout.ray_cpus_per_engine=0.5"]


def probe_and_final_checkpoint(tmp_path) -> str:
    """The trainer's callbacks for a run the test reads: the rank probe, and the final checkpoint
    (`run/checkpoints/last.ckpt`, as the default config writes it) that the test exports."""
    probe = f"{{_target_:tests.integration.ddp_probe.RankProbe,out_dir:'{tmp_path}/probe'}}"
    final = (
        f"{{_target_:lightning.pytorch.callbacks.ModelCheckpoint,dirpath:'{tmp_path}/run/checkpoints',"
        "filename:last,enable_version_counter:false,save_on_train_epoch_end:true}"
    )
    return f"trainer.callbacks=[{probe},{final}]"


@one_ray_test_at_a_time
def test_two_ddp_processes_on_a_ray_engine_train_a_task_mixture_each_group_once(tmp_path):
    # One run for what DDP promises (whole groups, each trained once across the ranks, one
    # accounting, equal EWMA averages), with the engines as Ray actors, for what a mixture of
    # tasks promises (training success per task over both ranks' shards, held-out validation and
    # accounting per task), and for the desk with a customer, one of its tasks, solved by asking.
    # One engine actor serves both ranks (each actor imports vLLM twice, as it spawns its engine
    # core); two engines under DDP run in the FSDP2 and exact-routes tests below.
    pytest.importorskip("ray")
    probe = probe_and_final_checkpoint(tmp_path)
    run_hydra(
        [
            *RAY,
            "experiment=task_mix",
            "reference=ewma",
            *SMALL_RUN,
            # Its own warm start, on rank 0 while the engine actors start (Ray, then vLLM's imports).
            "model.warm_start_steps=120",
            f"trainer.max_steps={STEPS}",
            "trainer.devices=2",
            "trainer.strategy=ddp",
            "rollout.num_engines=1",
            "rollout.max_concurrent_groups=8",  # the engine runs ahead: stale tokens, a moving average
            f"trainer.val_check_interval={STEPS}",
            # two held-out instances per task (guess-the-number holds out exactly two secrets)
            "rollout.eval_instances=6",
            "rollout.eval_samples=4",
            f"hydra.run.dir={tmp_path}/run",
            probe,
        ]
    )
    ranks = load_probes_and_check_each_group_trained_once(tmp_path / "probe")
    # DDP keeps the replicas equal (the task mix's entropy term moves them even when a batch's
    # rewards are all equal), and the EWMA callback's average agrees bit for bit.
    for name, tensor in ranks[0]["live"].items():
        assert torch.equal(tensor, ranks[1]["live"][name]), name
    assert ranks[0]["ewma_average"].keys() == ranks[1]["ewma_average"].keys()
    for name, tensor in ranks[0]["ewma_average"].items():
        assert torch.equal(tensor, ranks[1]["ewma_average"][name]), name
    # ... and it is an average, not a copy of the live weights (the test would be empty otherwise).
    assert any(not torch.equal(tensor, ranks[0]["live"][name]) for name, tensor in ranks[0]["ewma_average"].items())
    # The run's last checkpoint exports rank 0's policy at its end, and its EWMA average, bit for bit.
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert_exported_equal(exported_tensors(last, tmp_path / "exported"), ranks[0]["live"])
    averaged = exported_tensors(last, tmp_path / "exported_ewma", "--weights", "ewma")
    assert_exported_equal(averaged, {name.removeprefix("policy."): t for name, t in ranks[0]["ewma_average"].items()})
    rows = read_all_rows(tmp_path / "run" / "metrics.csv")
    train_rows = [row for row in rows if "rollout/produced" in row]
    assert len(train_rows) == STEPS
    for row in train_rows:
        assert_accounting_holds(row)
    # Every version reached the engine actor.
    assert [row for row in rows if "rollout/engine_version" in row][-1]["rollout/engine_version"] == STEPS
    assert_task_success_is_over_both_ranks(ranks, rows)
    assert_each_task_is_validated_and_counted_on_its_own(rows, train_rows[-1])
    assert_the_desk_with_a_customer_is_solved_by_asking(rows)
    assert (tmp_path / "run" / "summary.json").exists()  # written once, by rank 0
    # The Ray instance the run started is gone with it, its temp dir too.
    assert ray_processes() == []
    assert list(Path(ray_root()).glob("lit_asyncrl_ray_*")) == []


def assert_each_task_is_validated_and_counted_on_its_own(rows: list[dict], last: dict) -> None:
    """Held-out success per task (two instances each) before the first RL step and after the last,
    the overall value their mean; the accounting per task adds up to the run's."""
    validations = [row for row in rows if "val/avg@4" in row]
    assert [int(row["step"]) for row in validations] == [0, STEPS - 1]
    for row in validations:
        for task in TASKS:
            assert 0.0 <= row[f"val/{task}/avg@4"] <= row[f"val/{task}/pass@4"] <= 1.0
            assert row[f"val/{task}/greedy_success"] in (0.0, 0.5, 1.0)  # two greedy episodes per task
        for metric in ("avg@4", "pass@4", "greedy_success"):
            assert row[f"val/{metric}"] == pytest.approx(
                sum(row[f"val/{task}/{metric}"] for task in TASKS) / 3, abs=1e-6
            )
    # Each task played in its own format: the game's turns end at ';' and the desk's at a newline, and
    # both are won (random valid guesses win 0.34 of the games; the desk needs its demonstrations).
    assert max(row["val/guess_number/avg@4"] for row in validations) > 0.0
    assert max(row["val/desk/avg@4"] for row in validations) > 0.0
    assert last["rollout/env_failures"] == 0
    for outcome in ("produced", "trained", "dropped_stale"):
        assert sum(last.get(f"rollout/{task}/{outcome}", 0.0) for task in TASKS) == last[f"rollout/{outcome}"], outcome


def assert_the_desk_with_a_customer_is_solved_by_asking(rows: list[dict]) -> None:
    """The customer holds the order id, so only an agent that asks for it (`ask id`) can solve a
    request: after 120 warm-start steps on the mixture's demonstrations it does (measured:
    0.42-1.0 per step, 0.67 mean over the four steps that drew the task; the bound is the one the
    desk-with-a-customer run had, where 0.27 was measured)."""
    successes = [row["train/desk_customer/task_success"] for row in rows if "train/desk_customer/task_success" in row]
    assert successes and sum(successes) / len(successes) > 0.05, successes


def assert_task_success_is_over_both_ranks(ranks: list[dict], rows: list[dict]) -> None:
    """Each step's `train/<task>/task_success` is that task's share of successes over the episodes
    both ranks trained on (computed here from the probes), and absent where no episode had the task."""
    for step in range(STEPS):
        logged = {
            key: value
            for row in rows
            if row.get("step") == step
            for key, value in row.items()
            if key.endswith("/task_success")
        }
        expected = {}
        for index, name in enumerate(TASKS):
            outcomes = [
                won
                for state in ranks
                for won, task in zip(state["success"][step], state["task_ids"][step])
                if task == index
            ]
            if outcomes:
                expected[f"train/{name}/task_success"] = sum(outcomes) / len(outcomes)
        assert expected and {key: logged[key] for key in expected} == pytest.approx(expected), (step, logged)
        assert not set(logged) - set(expected) - {"train/task_success"}, (step, logged)


def load_probes_and_check_each_group_trained_once(probe_dir: Path) -> list[dict]:
    """The two ranks' probes, after checking that each step dealt the global batch (4 groups of 4)
    as 2 whole groups to each rank, that no group was trained twice, on one rank or across both,
    and that the one buffer's accounting counts what both ranks trained."""
    ranks = [torch.load(probe_dir / f"rank{rank}.pt") for rank in (0, 1)]
    assert [state["world_size"] for state in ranks] == [2, 2]
    seen: set[int] = set()
    for step in range(STEPS):
        shards = [ranks[rank]["group_ids"][step] for rank in (0, 1)]
        for ids in shards:
            assert len(ids) == 2 * GROUP_SIZE and len(set(ids)) == 2
            assert all(ids.count(group) == GROUP_SIZE for group in set(ids))  # whole groups
        step_groups = set(shards[0]) | set(shards[1])
        assert len(step_groups) == GROUPS_PER_BATCH and not step_groups & seen
        seen |= step_groups
    counts = ranks[0]["counts"]
    trained_on_ranks = sum(len(ids) for state in ranks for ids in state["group_ids"])
    assert counts["trained"] == trained_on_ranks == STEPS * GROUPS_PER_BATCH * GROUP_SIZE
    assert counts["produced"] == counts["trained"] + counts["dropped"] + counts["pending"]
    return ranks


def test_two_fsdp2_processes_shard_the_policy_and_push_exact_weights_to_two_engines(tmp_path):
    """FSDP2 (`trainer.strategy=fsdp2`): each rank holds half of each sharded tensor; the weight
    push gathers them on both ranks and rank 0 sends the whole model to both engines. In sync mode
    every token is sampled by the weights being trained, so async recompute's pi_ref (a forward of
    the sharded policy) equals the fp32 engines' mu only if every pushed tensor arrived whole and
    exact; the entropy term moves the weights every step."""
    probe = probe_and_final_checkpoint(tmp_path)
    run_hydra(
        [
            *SMALL_RUN,
            f"trainer.max_steps={STEPS}",
            "trainer.devices=2",
            "trainer.strategy=fsdp2",
            "rollout.num_engines=2",
            "rollout.mode=sync",
            "reference=async_recompute",
            "model.entropy_coef=0.01",
            "rollout.eval_instances=4",
            "rollout.eval_samples=4",
            f"hydra.run.dir={tmp_path}/run",
            probe,
        ]
    )
    ranks = load_probes_and_check_each_group_trained_once(tmp_path / "probe")
    for state in ranks:
        full = sum(tensor.numel() for tensor in state["live"].values())
        assert state["local_numel"] < 0.6 * full  # sharded: about half on each rank
        assert len(state["step_metrics"]) == STEPS
        for step in state["step_metrics"]:
            assert step["train/version_gap_max"] == 0
            assert step["train/ref_behavior_logratio_absmax"] < 1e-4
    # Both ranks gather one model, equal to the last bit.
    for name, tensor in ranks[0]["live"].items():
        assert torch.equal(tensor, ranks[1]["live"][name]), name
    # The run's last checkpoint (one full file) exports that model, bit for bit.
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert_exported_equal(exported_tensors(last, tmp_path / "exported"), ranks[0]["live"])
    rows = read_all_rows(tmp_path / "run" / "metrics.csv")
    for row in (row for row in rows if "rollout/produced" in row):
        assert_accounting_holds(row)
    assert_both_engines_generated(rows, steps=STEPS)


def test_exact_routes_under_ddp_on_two_engines_are_exact_on_every_rank(tmp_path):
    # Interruption-sync scores the unfinished episodes of both of rank 0's engines at every pause,
    # and the fidelity shadow keeps snapshots for the versions rank 0 says are live. pi_old at each
    # token's own version equals the fp32 engines' mu only if each engine labels its tokens with the
    # version that really sampled them (a wrong label shows ~1e-2 or more): on both ranks, every step.
    # The versions reach the engines over vLLM's weight-transfer API (gloo), so this also holds
    # only if every tensor of every push arrived exactly. Only the last layer and the final norm
    # train: after the first push each engine is sent those alone, and the frozen rest it holds
    # serves every version.
    probe = f"trainer.callbacks=[{{_target_:tests.integration.ddp_probe.RankProbe,out_dir:'{tmp_path}/probe'}}]"
    run_hydra(
        [
            "experiment=interrupt_sync",
            "fidelity=true",
            "rollout.num_engines=2",
            "rollout.weight_transfer=gloo",
            "model.train_last_layers=1",
            "trainer.devices=2",
            "trainer.strategy=ddp",
            *STALE_RUN,
            "rollout.eval_instances=4",
            "rollout.eval_samples=4",
            f"hydra.run.dir={tmp_path}/run",
            probe,
        ]
    )
    for rank in (0, 1):
        steps = torch.load(tmp_path / "probe" / f"rank{rank}.pt")["step_metrics"]
        assert len(steps) == 8
        assert max(step["train/version_gap_max"] for step in steps) >= 1, f"rank {rank} saw no stale token"
        for step in steps:
            assert step["train/nonfinite_tokens"] == 0
            assert step["train/ref_behavior_logratio_absmax"] < 1e-4
            assert step["fidelity/logratio_absmax"] <= 1e-5
    rows = read_all_rows(tmp_path / "run" / "metrics.csv")
    for row in (row for row in rows if "rollout/produced" in row):
        assert_accounting_holds(row)
    assert_both_engines_generated(rows, steps=8)
    # Layer 1 of the tiny policy (q, k, v, o, gate, up, down, the q/k norms, the two layer norms) and
    # the final norm, fp32: what each engine received per version.
    trained_bytes = 4 * (128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 256 * 128 + 64 + 64 + 128 + 128 + 128)
    assert trained_bytes == 591_872
    assert [row["rollout/weight_push_bytes"] for row in rows if "rollout/weight_push_bytes" in row] == [
        trained_bytes
    ] * 8


@one_ray_test_at_a_time
def test_the_ray_actors_keep_their_promises_and_a_killed_trainer_leaves_no_ray_behind():
    # In a process then SIGKILLed with the actors and the Ray instance it started still up: the
    # engine in a Ray actor passes the local engine's checks (`test_engine_versions.py`) with its
    # weights pushed over vLLM's weight-transfer API (gloo, through vLLM's Ray client), and the
    # dedicated old-logit worker in a Ray actor gives pi_old equal to the engine's mu, which holds
    # only if both got every tensor exactly. Then its reapers end Ray's processes and the actors'
    # engine and remove their dirs (a clean end of Ray is checked after the DDP run above).
    pytest.importorskip("ray")
    from tests.integration.ray_contract_run import KEPT
    from tests.support.leftovers import left_behind, listing

    before = listing()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.ray_contract_run"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output = []
        for line in process.stdout:  # ends when the process does (a failed check)
            output.append(line)
            if KEPT in line:
                break
        assert KEPT in "".join(output), "".join(output)[-4000:]
        assert ray_processes() != []
    finally:
        process.kill()
        process.wait(timeout=10)
    deadline = time.monotonic() + 30
    while (ray_processes() or left_behind(before)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray_processes() == []
    assert left_behind(before) == []
