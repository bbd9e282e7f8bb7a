"""Bad configuration fails before any engine starts, with a message naming the key to fix."""

import re
import subprocess
import sys
import time

import pytest

from lit_asyncrl.datamodule import RolloutDataModule
from lit_asyncrl.envs import GuessNumberEnv
from lit_asyncrl.losses import DecoupledPPO
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.rollout.settings import RolloutConfig


def test_datamodule_rejects_a_missing_model_before_the_engine():
    with pytest.raises(ValueError, match=r"model\.path"):
        RolloutDataModule(model_path="/nonexistent/model")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_version_gap": -1}, "rollout.max_version_gap must be an integer >= 0, got -1"),
        (
            {"group_size": 8, "groups_per_batch": 16, "buffer_capacity": 64},
            "rollout.buffer_capacity=64 is smaller than one batch (rollout.groups_per_batch * rollout.group_size = 128 episodes)",
        ),
        ({"mode": "sync", "weight_sync_every": 2}, "rollout.mode='sync' needs rollout.weight_sync_every=1"),
        ({"temperature": 0.0}, "rollout.temperature must be > 0, got 0.0"),
        ({"group_size": 0}, "rollout.group_size must be an integer >= 1, got 0"),
        ({"kv_cache_gib": 0}, "rollout.kv_cache_gib must be > 0 or null, got 0"),
        ({"top_k": 0}, "rollout.top_k must be -1 (no top-k) or an integer >= 1, got 0"),
        ({"batch_timeout_s": 0}, "rollout.batch_timeout_s must be > 0, got 0"),
        ({"eval_timeout_s": -1.0}, "rollout.eval_timeout_s must be > 0, got -1.0"),
        ({"engine_log_level": "LOUD"}, "rollout.engine_log_level must be one of"),
        ({"num_engines": 1.5}, "rollout.num_engines must be an integer >= 1, got 1.5"),
    ],
)
def test_rollout_settings_are_checked_when_made(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RolloutConfig.from_keys(**settings)


def test_a_context_without_room_for_one_whole_turn_is_refused_before_the_engine():
    # Guess-the-number opens with BOS and "?" (2 tokens of the character tokenizer) and a turn may
    # take max_turn_tokens = len("10") + 1 = 3 (digits and the `;`): 5 is the shortest context.
    with pytest.raises(ValueError) as raised:
        RolloutDataModule(env=GuessNumberEnv(), rollout=RolloutConfig.from_keys(max_model_len=4))
    assert str(raised.value) == (
        "rollout.max_model_len=4 leaves no room for one agent turn: the first prompt of GuessNumberEnv is already 2 tokens "
        "and a turn may take 3 more (env.max_turn_tokens); set rollout.max_model_len >= 5"
    )
    RolloutDataModule(env=GuessNumberEnv(), rollout=RolloutConfig.from_keys(max_model_len=5))  # prompt and turn fit


def test_a_route_this_machine_lacks_is_refused_when_the_service_is_built():
    with pytest.raises(ValueError, match=r"^rollout\.weight_transfer=nccl needs CUDA GPUs"):  # no CUDA on this machine
        RolloutDataModule(rollout=RolloutConfig.from_keys(weight_transfer="nccl"))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"model_path": "/nonexistent/model"}, "model.path"),
        ({"loss": "decoupled_ppo"}, "model.loss must be a lit_asyncrl.losses.LossStrategy"),  # a name is not an object
        ({"reference": "snapshot"}, "model.reference must be a lit_asyncrl.reference.ReferenceSource"),
        ({"loss": DecoupledPPO()}, "model.reference"),  # needs pi_ref, none configured
    ],
)
def test_module_rejects_bad_config(kwargs, fragment):
    with pytest.raises((ValueError, TypeError), match=re.escape(fragment)):
        AsyncRLModule(**kwargs)


def test_the_weight_route_is_chosen_again_once_the_number_of_training_processes_is_known(monkeypatch):
    """On a GPU machine `auto` means IPC for one process beside its engine; under DDP only rank 0
    pushes, so it turns into NCCL, and an explicit `ipc` is refused, naming the key."""
    from types import SimpleNamespace

    import lit_asyncrl.rollout.serving.vllm_service as vllm_service

    monkeypatch.setattr(vllm_service, "trainer_device_type", lambda: "cuda")
    for requested, alone, under_ddp in (("auto", "ipc", "nccl"), ("gloo", "gloo", "gloo"), ("ipc", "ipc", None)):
        data = RolloutDataModule(
            rollout=RolloutConfig.from_keys(
                weight_transfer=requested, groups_per_batch=4, group_size=2, buffer_capacity=16
            )
        )
        assert data.rollouts.engine_settings.weight_transfer == alone
        data.trainer = SimpleNamespace(world_size=2, global_rank=1)
        if under_ddp is None:
            with pytest.raises(ValueError, match=r"rollout\.weight_transfer=ipc with 2 trainer processes"):
                data.setup("fit")
        else:
            data.setup("fit")
            assert data.rollouts.service.engine_settings.weight_transfer == under_ddp


def test_inverted_bounds_name_the_argument():
    with pytest.raises(ValueError, match="clip_bounds"):
        DecoupledPPO(clip_bounds=(1.2, 0.8))


def test_hydra_entry_fails_fast_on_a_missing_model_path(tmp_path):
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "lit_asyncrl.train", "model.path=/nonexistent/model", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "model.path='/nonexistent/model'" in result.stderr + result.stdout
    assert "EngineCore" not in result.stderr + result.stdout  # no engine was started
    # Named before Lightning's imports (0.5 s alone; 6-8 s when it came after them).
    assert time.monotonic() - start < 10


# (Hydra overrides, a fragment of the error that names the key or value to fix): each is refused
# by `lit_asyncrl.train.build`, which starts nothing, so every refusal comes before any engine.
MALFORMED = [
    (["loss=decoupled_ppo", "reference=none"], "model.reference"),  # the README sweep's second job
    (
        ["rollout.push_changed_elements=true"],
        "rollout.push_changed_elements=true needs rollout.weight_transfer=staged (got file)",
    ),
    (
        ["rollout.weight_transfer=staged", "rollout.placement=ray"],
        "rollout.weight_transfer=staged packs weights for vLLM's CPU kernels",
    ),
    (["loss.clip_bounds=[1.2,0.8]"], "clip_bounds"),
    (["loss.clip_bounds=[1.1,1.2]"], "clip_bounds"),  # does not contain 1
    (["loss=decoupled_ppo", "reference=snapshot", "loss.discrepancy_bounds=[0.5,0.9]"], "discrepancy_bounds"),
    (["loss=decoupled_ppo", "reference=ewma", "reference.beta=1.5"], "reference.beta"),
    (["loss=decoupled_ppo", "reference=ewma", "reference.beta=0"], "reference.beta"),
    (["model.lora.rank=-1"], "model.lora.rank must be an integer >= 0"),
    (["model.lora.rank=8", "model.lora.push=delta"], "model.lora.push='delta'"),
    (["model.lora.rank=8", "model.train_last_layers=1"], "set one of them"),
    # Tied to model.lora in the Hydra config: Hydra refuses to set it alone, naming it.
    (["model.lora.rank=8", "rollout.lora.rank=16"], "Could not override 'rollout.lora.rank'"),
    (
        ["experiment=interrupt_sync", "model.lora.rank=8"],
        "reference=interrupt_sync with model.lora.push=adapter needs model.lora.in_flight=move",
    ),
    (
        ["experiment=dedicated", "model.lora.rank=8"],
        "reference=dedicated with model.lora.push=adapter needs model.lora.in_flight=move",
    ),
    (["model.lora.rank=8", "model.lora.in_flight=stay"], "model.lora.in_flight='stay': choose one of finish, move"),
    (["rollout.max_version_gap=-1"], "rollout.max_version_gap"),
    (["rollout.max_version_gap=1.5"], "rollout.max_version_gap"),
    (["rollout.group_size=0"], "rollout.group_size"),
    (["rollout.group_size=2.5"], "rollout.group_size"),
    (["rollout.groups_per_batch=0"], "rollout.groups_per_batch"),
    (["rollout.buffer_capacity=4"], "rollout.buffer_capacity"),
    (["rollout.max_concurrent_groups=0"], "rollout.max_concurrent_groups"),
    (["rollout.temperature=-1"], "rollout.temperature"),
    (["rollout.dtype=float8"], "rollout.dtype"),
    (["rollout.max_model_len=2"], "rollout.max_model_len"),  # the first prompt alone fills it
    (["rollout.max_model_len=4"], "rollout.max_model_len=4 leaves no room for one agent turn"),  # prompt 2 + turn 3
    (["rollout.max_model_len=1.5"], "rollout.max_model_len"),
    (["rollout.mode=semi"], "rollout.mode"),
    (["rollout.mode=sync", "rollout.weight_sync_every=2"], "rollout.weight_sync_every"),
    (["rollout.weight_sync_every=0"], "rollout.weight_sync_every"),
    (["rollout.engine_log_level=LOUD"], "rollout.engine_log_level"),
    (["rollout.eval_k=0"], "rollout.eval_k"),
    (["rollout.eval_k=9"], "rollout.eval_samples"),  # pass@9 from 8 samples
    (["rollout.eval_instances=0"], "rollout.eval_instances"),
    (["env=service_desk", "rollout.max_model_len=8"], "rollout.max_model_len"),  # the desk's first prompt fills it
    (["rollout.kv_cache_fraction=2"], "rollout.kv_cache_fraction"),
    (["model.path=/nonexistent/model"], "model.path"),
    (["model.lr=-1"], "model.lr"),
    (["model.entropy_coef=-0.1"], "model.entropy_coef"),
    (["model.train_last_layers=3"], "model.train_last_layers"),  # the tiny policy has 2 layers
    (["model.warm_start_steps=-1"], "warm_start.steps"),
    (["loss=decoupled_ppo", "reference=snapshot", "reference.max_resident=2"], "reference.max_resident"),
    (["loss=decoupled_ppo", "reference=snapshot", "reference.max_staleness=1"], "reference.max_staleness"),
    (["experiment=dedicated", "rollout.num_engines=2"], "reference=dedicated runs with rollout.num_engines=1, got 2"),
    (["env.span=1"], "env.span"),
    (["env.held_out=[11]"], "env.held_out"),
    (["env=guess_number", "env.max_value=0"], "env.max_value"),
    (["env.max_turns=0"], "env.max_turns"),
    (["env.latency_s=-1"], "env.latency_s"),
    (["env=service_desk", "env.difficulty=extreme"], "env.difficulty"),
    (["env=reasoning_gym", "env.turn_stop=ab"], "env.turn_stop"),  # not one token of the tiny tokenizer
    (["env=reasoning_gym", "env.task=no_such_task"], "env.task"),
    (["env=reasoning_gym", "env.answer_format=first_number"], "env.answer_format"),
    (["env=mixture", "env.weights={desk: 2, airline: 1}"], "env.weights.airline: no such task"),
    (["env=mixture", "env.weights={desk: 0}"], "env.weights.desk must be a number > 0"),
    (
        ["env=mixture", "+env.tasks.guess_number.max_value=0"],
        "full_key: data.env.tasks.guess_number",
    ),  # a task's own check, named by its path
    (
        ["env=mixture", "rollout.max_model_len=12"],
        "first prompt of ServiceDeskEnv",
    ),  # each task's first prompt is checked
    (["loss=no_such_loss"], "loss/no_such_loss"),
    (["reference=no_such_reference"], "reference/no_such_reference"),
    (["env=no_such_env"], "env/no_such_env"),
    (["fidelity=true", "fidelity_proxies=[ewma,ewma_2]"], "fidelity_proxies: unknown proxy 'ewma_2'"),
    (["fidelity_proxies=[ewma]"], "fidelity_proxies are measured by the fidelity shadow: set fidelity=true"),
    (["fidelity=true", "fidelity_proxies=ewma"], "fidelity_proxies must be a list of proxy names"),
    (["stage=predict"], "stage must be 'fit' or 'validate'"),
    (["stage=validate"], "ckpt_path"),
]


@pytest.mark.parametrize(("overrides", "fragment"), MALFORMED, ids=[" ".join(case) for case, _ in MALFORMED])
def test_malformed_configuration_is_refused_before_anything_starts(overrides, fragment, tmp_path):
    import threading

    from lit_asyncrl.train import build
    from tests.support.configs import compose_train

    start = time.monotonic()
    with pytest.raises(Exception) as raised:
        cfg = compose_train(
            [
                *overrides,
                f"hydra.run.dir={tmp_path}",
                f"trainer.default_root_dir={tmp_path}",
                f"trainer.logger.save_dir={tmp_path}",
            ]
        )
        build(cfg)
    message = str(raised.value) + "".join(f" {cause}" for cause in _causes(raised.value))
    assert fragment in message
    # A Hydra user set `rollout.<key>`: the message names that, never the CLI's `data.rollout.<key>`.
    assert "data.rollout." not in message
    assert time.monotonic() - start < 10
    assert not [thread for thread in threading.enumerate() if thread.name == "vllm-engine"]


def test_the_table_covers_at_least_25_cases():
    assert len({" ".join(case) for case, _ in MALFORMED}) >= 25


def _causes(error: BaseException):
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
        yield error


def test_stage_validate_without_a_checkpoint_or_a_folder_is_refused_before_anything_is_built(tmp_path):
    from lit_asyncrl.train import build
    from tests.support.configs import compose_train

    with pytest.raises(ValueError, match=r"stage=validate evaluates a checkpoint or a model folder: set ckpt_path"):
        build(compose_train(["stage=validate", f"hydra.run.dir={tmp_path}"]))
    # A model folder of the user's is evaluated as it is.
    folder = ["model=hf", f"model.path={resolve_model_path(None)}", f"trainer.logger.save_dir={tmp_path}"]
    module, *_ = build(compose_train(["stage=validate", *folder, f"hydra.run.dir={tmp_path}"]))
    assert module.hparams.model_path == str(resolve_model_path(None))


@pytest.mark.parametrize(
    ("argument", "fragment"),
    [
        (
            "--data.rollout.batch.max_version_gap=-1",
            "data.rollout.batch.max_version_gap must be an integer >= 0, got -1",
        ),
        ("--data.rollout.engine.kv_cache_fraction=2", "data.rollout.engine.kv_cache_fraction must be in (0, 1], got 2"),
    ],
)
def test_the_lightning_cli_names_its_own_paths(argument, fragment, tmp_path):
    # The same checks as the Hydra entry's, named by the path a CLI user passes.
    from lit_asyncrl.cli import AsyncRLCLI
    from lit_asyncrl.config_dir import config_dir
    from lit_asyncrl.datamodule import RolloutDataModule
    from lit_asyncrl.module import AsyncRLModule

    config = f"{config_dir()}/cli/default.yaml"
    with pytest.raises(ValueError) as raised:
        AsyncRLCLI(
            AsyncRLModule,
            RolloutDataModule,
            run=False,
            args=["--config", config, argument, "--trainer.default_root_dir", str(tmp_path)],
        )
    message = str(raised.value) + "".join(f" {cause}" for cause in _causes(raised.value))
    assert fragment in message and fragment.removeprefix("data.") not in message.replace(fragment, "")


@pytest.mark.parametrize(
    ("override", "group", "existing"),
    [("experiment=snapshto", "experiment", "snapshot"), ("setting=findngs", "setting", "findings")],
)
def test_an_experiment_or_setting_that_names_no_file_is_refused_naming_the_key_and_the_choices(
    override, group, existing
):
    # Hydra skips an `optional` default whose file is missing: a typo in the first key a user writes would
    # run the default without a word. Not optional, Hydra refuses it, names it and lists what exists.
    from hydra.errors import MissingConfigException

    from tests.support.configs import compose_train

    with pytest.raises(MissingConfigException) as refused:
        compose_train([override])
    message = str(refused.value)
    assert f"Could not find '{group}/{override.split('=')[1]}'" in message
    assert f"Available options in '{group}'" in message and f"\t{existing}\n" in message
