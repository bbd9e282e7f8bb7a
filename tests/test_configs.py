"""Every shipped config composes and builds the intended objects without starting an engine, and
the Lightning CLI configs build the same objects as their Hydra experiments."""

import dataclasses
from pathlib import Path

import lightning as L
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_asyncrl.cli import AsyncRLCLI
from lit_asyncrl.cli_configs import hydra_runs, render, render_composed
from lit_asyncrl.datamodule import RolloutDataModule
from lit_asyncrl.losses import available_losses, loss_class
from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference import available_references, build_reference
from lit_asyncrl.rollout.settings import RolloutConfig
from lit_asyncrl.train import build
from tests.support.configs import CONFIG_DIR, compose_train
from tests.support.experiment_data import experiment_data
from tests.support.xdist_groups import grouped_by_imports

EXPERIMENTS = sorted(path.stem for path in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
LOSSES = sorted(path.stem for path in (Path(CONFIG_DIR) / "loss").glob("*.yaml"))


#: Written by hand from the paper's Table 1 and docs/method.md (section 6), not read from the code.
EXACT_REFERENCES = {"snapshot", "interrupt_sync", "dedicated"}


def test_every_registered_loss_has_a_config():
    assert LOSSES == sorted(available_losses())


@pytest.mark.parametrize(
    "experiment", [pytest.param(name, marks=grouped_by_imports([f"experiment={name}"])) for name in EXPERIMENTS]
)
def test_experiment_instantiates(experiment, tmp_path):
    # Built as a run builds it (every value and combination checked); a README command that is only
    # `experiment=<name>` is left to this test (tests/test_readme_commands.py).
    overrides = [f"experiment={experiment}"]
    cfg = compose_train(overrides)
    # The Lightning CLI config shipped for it is generated from this composition.
    assert (Path(CONFIG_DIR) / "cli" / f"{experiment}.yaml").read_text() == render_composed(
        experiment, overrides, cfg
    ), f"run python -m lit_asyncrl.cli_configs ({experiment})"
    # runtime.output_dir only exists inside @hydra.main; point the logger at tmp_path instead.
    settings = {"trainer.default_root_dir": str(tmp_path), "trainer.logger.save_dir": str(tmp_path)}
    settings |= {"checkpoint_every": 7, **experiment_data(overrides, tmp_path)}
    for key, value in settings.items():
        OmegaConf.update(cfg, key, value)
    module, datamodule, _, trainer = build(cfg)
    assert datamodule.rollouts.engine is None  # nothing started
    assert (
        trainer.max_steps
        == cfg.trainer.max_steps
        == {
            "service_desk": 300,
            "service_desk_tools": 300,
            "service_desk_user": 300,
            "service_desk_llm_user": 20,
            "agent_program": 12,
            "smollm2_arithmetic": 12,
            "smollm2_dataset": 30,
            "smollm2_lora": 12,
            "smollm2_desk_tools": 6,
            "smollm2_tau2": 3,
            "task_mix": 300,
        }.get(experiment, 500)
    )
    periodic, final = trainer.checkpoint_callbacks
    assert periodic._every_n_train_steps == 7 and final.filename == "last"
    assert cfg.loss._target_.endswith(type(module.loss_fn).__name__)


@pytest.mark.parametrize("loss", LOSSES)
def test_loss_group_selects_the_registered_strategy(loss):
    # Each entry of the group on its own; that the chosen entry reaches the module is checked on
    # composed runs (every experiment above, and the loss arguments below).
    assert type(instantiate(OmegaConf.load(Path(CONFIG_DIR) / "loss" / f"{loss}.yaml"))) is loss_class(loss)


def test_loss_arguments_reach_the_strategy(tmp_path):
    cfg = compose_train(
        [
            "loss=decoupled_ppo",
            "loss.clip_bounds=[0.9,1.1]",
            "loss.discrepancy_bounds=[0.99,1.01]",
            f"hydra.run.dir={tmp_path}",
            "reference=async_recompute",
        ]
    )
    module = instantiate(cfg.module, _convert_="all")
    assert tuple(module.loss_fn.clip_bounds) == (0.9, 1.1)
    assert tuple(module.loss_fn.discrepancy_bounds) == (0.99, 1.01)


@pytest.mark.parametrize("reference", sorted(available_references()))
def test_reference_group_selects_the_source(reference, tmp_path):
    overrides = [f"reference={reference}", f"hydra.run.dir={tmp_path}"]
    module = instantiate(compose_train(overrides).module, _convert_="all")
    assert type(module.reference) is type(build_reference(reference))
    assert module.reference.exact == (reference in EXACT_REFERENCES)


def test_a_loss_that_needs_a_reference_without_one_fails_naming_the_keys(tmp_path):
    cfg = compose_train(["loss=decoupled_ppo", "reference=none", f"hydra.run.dir={tmp_path}"])
    with pytest.raises(Exception, match=r"model\.reference"):
        instantiate(cfg.module, _convert_="all")


def test_snapshot_window_follows_the_staleness_cap(tmp_path):
    cfg = compose_train(["experiment=snapshot", "rollout.max_version_gap=2", f"hydra.run.dir={tmp_path}"])
    module = instantiate(cfg.module, _convert_="all")
    datamodule = instantiate(cfg.data, _convert_="all")
    module.reference.bind(datamodule.rollouts)
    assert module.reference.retention.store.max_staleness == 2


def test_snapshot_budget_too_small_for_the_staleness_cap_fails_naming_the_key(tmp_path):
    cfg = compose_train(
        ["experiment=snapshot", "rollout.max_version_gap=3", "reference.max_resident=2", f"hydra.run.dir={tmp_path}"]
    )
    module = instantiate(cfg.module, _convert_="all")
    datamodule = instantiate(cfg.data, _convert_="all")
    with pytest.raises(ValueError, match="max_resident=2"):
        module.reference.bind(datamodule.rollouts)


def test_snapshot_window_below_the_cap_is_refused(tmp_path):
    cfg = compose_train(
        ["experiment=snapshot", "rollout.max_version_gap=3", "reference.max_staleness=1", f"hydra.run.dir={tmp_path}"]
    )
    module = instantiate(cfg.module, _convert_="all")
    with pytest.raises(ValueError, match="rollout.max_version_gap=3"):
        module.reference.bind(instantiate(cfg.data, _convert_="all").rollouts)


def test_sweeps_name_existing_experiments_and_keys(tmp_path):
    table1 = compose_train(["+sweep=table1", f"hydra.run.dir={tmp_path}"])
    assert set(table1.hydra.sweeper.params.experiment.split(",")) <= set(EXPERIMENTS)
    decay = compose_train(["experiment=ppo_ewma", "+sweep=ewma_decay", f"hydra.run.dir={tmp_path}"])
    for key in decay.hydra.sweeper.params:
        # Every swept key exists in the composed config, so the sweep cannot fail on a typo.
        node, leaf = key.rsplit(".", 1)
        assert leaf in decay[node], key


FINDINGS_SWEEPS = ("findings_quick", "table2", "fig3", "fig4", "fig10")


@pytest.mark.parametrize("sweep", FINDINGS_SWEEPS)
def test_findings_sweeps_build_every_job_in_the_paper_setting(sweep, tmp_path):
    params = compose_train([f"+sweep={sweep}", f"hydra.run.dir={tmp_path}"]).hydra.sweeper.params
    experiments = params["experiment"].split(",")
    assert set(experiments) <= set(EXPERIMENTS)
    for experiment in experiments:
        # Each job as the sweeper launches it; the swept keys other than the experiment take their first value.
        others = [
            f"{key}={value.split('],')[0] + ']' if value.startswith('[') else value.split(',')[0]}"
            for key, value in params.items()
            if key != "experiment"
        ]
        cfg = compose_train([f"+sweep={sweep}", f"experiment={experiment}", *others, f"hydra.run.dir={tmp_path}"])
        # The setting of the findings: bf16 engine, fp32 trainer, gap cap 3, the service desk, fidelity on.
        assert (cfg.rollout.dtype, cfg.rollout.max_version_gap, cfg.fidelity, cfg.skip_finished) == (
            "bfloat16",
            3,
            True,
            True,
        )
        assert cfg.env._target_.endswith("ServiceDeskEnv")
        assert cfg.hydra.sweep.dir == f"results/findings/{sweep.removeprefix('findings_')}"
        module = instantiate(cfg.module, _convert_="all")
        assert module.loss_fn.discrepancy_bounds == (0.9, 1.1)  # the setting's mask, also fig3's first value
        assert module.fidelity is not None


# -- Lightning CLI parity --------------------------------------------------------------------


def shape(value):
    """A config object as plain values: its type and public attributes, nested objects alike."""
    if type(value).__module__.startswith("lit_asyncrl."):
        return type(value), {k: shape(v) for k, v in vars(value).items() if not k.startswith("_")}
    return value


def describe(module: AsyncRLModule, datamodule: RolloutDataModule) -> dict:
    """What a run's semantics depend on, as plain values."""
    rollouts = datamodule.rollouts
    public = lambda obj: {k: v for k, v in vars(obj).items() if not k.startswith("_")}  # noqa: E731
    return {
        # the environment's tasks (itself, or a mixture's), with their users
        "tasks": {name: shape(task) for name, task in rollouts.env.tasks().items()},
        "loss": (type(module.loss_fn), public(module.loss_fn)),
        "reference": (type(module.reference), public(module.reference)),
        "hparams": {k: v for k, v in module.hparams.items() if not k.startswith("_")},  # the CLI adds _class_path
        "env": (type(rollouts.env), public(rollouts.env)),
        "rollout": datamodule.rollout_config,  # every rollout setting, one dataclass
        "service": {key: getattr(rollouts, key) for key in ("model_path", "engine_settings", "seed")},
        "buffer_capacity": rollouts.buffer.capacity,
    }


def test_cli_configs_are_generated_from_the_current_hydra_configs():
    # Each experiment's is checked where it is built (test_experiment_instantiates); here the default
    # run's, and that no config is left over from an experiment that is gone.
    assert (Path(CONFIG_DIR) / "cli" / "default.yaml").read_text() == render("default", []), (
        "run python -m lit_asyncrl.cli_configs (default)"
    )
    assert sorted(path.stem for path in (Path(CONFIG_DIR) / "cli").glob("*.yaml")) == sorted(hydra_runs())


@pytest.mark.parametrize("name", ["default", "snapshot", "ppo_ewma", "sync", "linear_prox_train_infer", "task_mix"])
def test_cli_config_builds_the_same_objects_as_hydra(name, tmp_path):
    overrides = hydra_runs()[name]
    cfg = compose_train([*overrides, f"hydra.run.dir={tmp_path}"])
    hydra_side = describe(instantiate(cfg.module, _convert_="all"), instantiate(cfg.data, _convert_="all"))
    cli = AsyncRLCLI(
        AsyncRLModule,
        RolloutDataModule,
        run=False,
        args=[
            "--config",
            str(Path(CONFIG_DIR) / "cli" / f"{name}.yaml"),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
        ],
    )
    assert describe(cli.model, cli.datamodule) == hydra_side
    assert vars(cli.config_init["warm_start"]) == vars(instantiate(cfg.warm_start))


def test_every_rollout_setting_has_one_default_in_the_class_and_the_config():
    """`conf/rollout/async.yaml` lists every field of `RolloutConfig` with the class's own default,
    and nothing else: a Python user and a Hydra user start from the same settings."""
    raw = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "rollout" / "async.yaml"))
    assert raw.pop("_target_") == "lit_asyncrl.rollout.settings.RolloutConfig.from_keys"
    # The adapter is the model's (model.lora), whose own config holds the class's default.
    assert raw.pop("lora") == "${model.lora}"
    assert instantiate(OmegaConf.load(Path(CONFIG_DIR) / "model" / "lora" / "default.yaml")) == LoRASettings()
    parts = [getattr(RolloutConfig(), field.name) for field in dataclasses.fields(RolloutConfig)]
    defaults = {
        field.name: field.default for part in parts for field in dataclasses.fields(part) if field.name != "lora"
    }
    assert raw == defaults
    assert RolloutConfig.from_keys(**raw) == RolloutConfig()


def test_the_datamodule_takes_the_rollout_settings_whole():
    """No key of `rollout.*` is forwarded one by one: `data` names the settings object and the service factory."""
    data = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "train.yaml")["data"], resolve=False)
    assert data == {
        "_target_": "lit_asyncrl.datamodule.RolloutDataModule",
        "model_path": "${model.path}",
        "env": "${env}",
        "rollout": "${rollout}",
        "seed": "${seed}",
        "service": {"_target_": "lit_asyncrl.rollout.vllm_service_factory.VLLMServiceFactory"},
    }


def test_ppo_ewma_is_the_papers_method_with_beta_from_the_staleness_window(tmp_path):
    from tests.support.batches import all_version, make_batch
    from tests.support.fakes import FakeRollouts
    from tests.support.lightning import ListDataModule, make_trainer

    cfg = compose_train(["experiment=ppo_ewma", "rollout.max_version_gap=3", f"hydra.run.dir={tmp_path}"])
    assert cfg.reference.beta is None  # no fixed decay: W/(W+2)
    assert compose_train(["experiment=ppo_ewma_beta075", f"hydra.run.dir={tmp_path}"]).reference.beta == 0.75
    module = instantiate(cfg.module, _convert_="all")
    (ewma,) = module.reference.callbacks()
    batches = [
        make_batch(all_version(0), [1.0, 0.0, 1.0, 0.0]),
        make_batch({0: [0, 0, 1], 1: [1, 1], 2: [0], 3: [1, 1]}, [1.0, 0.0, 0.0, 1.0]),  # gaps up to 1
        make_batch({0: [1, 1, 2], 1: [2, 2], 2: [1], 3: [2, 2]}, [0.0, 1.0, 0.0, 1.0]),  # gaps up to 1
        make_batch({0: [0, 1, 3], 1: [3, 3], 2: [2], 3: [3, 3]}, [1.0, 1.0, 0.0, 0.0]),  # a gap of 3
    ]
    betas = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            betas.append(ewma.beta)  # the decay of the previous step's update

    trainer = make_trainer(len(batches), [Record()])
    trainer.fit(module, datamodule=ListDataModule(batches, FakeRollouts()))
    betas.append(ewma.beta)
    # before any gap W = 2 (beta 0.5); then the largest gap seen is 0, 1, 1, 3: beta = 0, 1/3, 1/3, 3/5
    assert betas == pytest.approx([0.5, 0.0, 1 / 3, 1 / 3, 0.6])


@pytest.mark.parametrize(("sweep", "model"), [("regime_map", None), ("regime_map_smollm2", "smollm2_135m")])
def test_the_regime_map_sweeps_vary_the_learning_rate_over_two_decades_with_every_proxy_measured(
    sweep, model, tmp_path
):
    cfg = compose_train([f"+sweep={sweep}", f"hydra.run.dir={tmp_path}"])
    rates = [float(value) for value in cfg.hydra.sweeper.params["model.lr"].split(",")]
    assert max(rates) / min(rates) >= 100
    assert (
        cfg.model.path == model
        and cfg.rollout.dtype == "bfloat16"
        and cfg.reference._target_.endswith("SnapshotReference")
    )
    module = instantiate(cfg.module, _convert_="all")
    assert module.loss_fn.discrepancy_bounds == (0.99, 1.01)  # the paper's mask, whose half-width the map marks
    assert [proxy.name for proxy in module.fidelity.panel.proxies] == [
        "async_recompute", "linear_prox", "loglinear_prox", "ewma", "ewma_0.75", "ewma_0.9"
    ]  # fmt: skip


def test_figure_10_in_the_proxies_regime_compares_decays_without_the_reset(tmp_path):
    params = compose_train(["+sweep=fig10_regime", f"hydra.run.dir={tmp_path}"]).hydra.sweeper.params
    betas = params["reference.beta"].split(",")
    assert betas == ["0.9", "0.75", "null", "0.5"]  # null: the paper's W/(W+2)
    for beta in betas:
        cfg = compose_train(
            [
                "+sweep=fig10_regime",
                f"experiment={params['experiment']}",
                f"reference.beta={beta}",
                f"hydra.run.dir={tmp_path}",
            ]
        )
        module = instantiate(cfg.module, _convert_="all")
        assert module.reference.patience is None and module.reference.beta == (None if beta == "null" else float(beta))
        assert (module.hparams.lr, module.loss_fn.discrepancy_bounds, module.loss_fn.clip_bounds) == (
            6e-5,
            (0.99, 1.01),
            (0.997, 1.004),
        )


def test_figure_4_in_the_proxies_regime_resets_below_the_masks_usual_level(tmp_path):
    params = compose_train(["+sweep=fig4_regime", f"hydra.run.dir={tmp_path}"]).hydra.sweeper.params
    # 0.9 and 0.8 times 0.912, the exact route's mean mask at this learning rate (regime map)
    assert [float(tau) for tau in params["reference.tau"].split(",")] == [round(0.9 * 0.912, 2), round(0.8 * 0.912, 2)]
    cfg = compose_train(
        ["+sweep=fig4_regime", f"experiment={params['experiment']}", "reference.tau=0.82", f"hydra.run.dir={tmp_path}"]
    )
    module = instantiate(cfg.module, _convert_="all")
    assert (module.reference.beta, module.reference.tau, module.reference.patience) == (None, 0.82, 3)
    assert (module.hparams.lr, module.loss_fn.discrepancy_bounds, module.loss_fn.clip_bounds) == (
        6e-5,
        (0.99, 1.01),
        (0.997, 1.004),
    )


def test_table2_in_the_proxies_regime_builds_every_method_with_the_papers_mask_and_clip(tmp_path):
    params = compose_train(["+sweep=table2_regime", f"hydra.run.dir={tmp_path}"]).hydra.sweeper.params
    assert params["seed"] == "0,1,2,3,4"  # at least 5 seeds
    experiments = params["experiment"].split(",")
    assert {"snapshot", "ppo_ewma", "ppo_ewma_beta075", "linear_prox_train_infer", "decoupled_async"} <= set(
        experiments
    )
    for experiment in experiments:
        cfg = compose_train(["+sweep=table2_regime", f"experiment={experiment}", "seed=0", f"hydra.run.dir={tmp_path}"])
        module = instantiate(cfg.module, _convert_="all")
        assert (module.hparams.lr, module.loss_fn.discrepancy_bounds, module.loss_fn.clip_bounds) == (
            6e-5,
            (0.99, 1.01),
            (0.997, 1.004),
        )
        assert cfg.rollout.dtype == "bfloat16" and cfg.hydra.sweep.dir == "results/findings/table2_regime"


def test_table2s_rerun_runs_its_decisive_arms_with_ten_seeds_both_betas_and_the_regime_logged(tmp_path):
    params = compose_train(["+sweep=table2_decisive", f"hydra.run.dir={tmp_path}"]).hydra.sweeper.params
    assert params["seed"] == ",".join(map(str, range(10)))
    betas = {}
    for experiment in params["experiment"].split(","):
        cfg = compose_train(
            ["+sweep=table2_decisive", f"experiment={experiment}", "seed=0", f"hydra.run.dir={tmp_path}"]
        )
        assert (cfg.model.lr, list(cfg.loss.discrepancy_bounds), list(cfg.loss.clip_bounds)) == (
            6e-5,
            [0.99, 1.01],
            [0.997, 1.004],
        )
        # fidelity on: every run logs its drift per version and its discrepancy; 3 evaluations to average at the end
        assert (cfg.fidelity, cfg.rollout.eval_instances, cfg.trainer.val_check_interval, cfg.trainer.max_steps) == (
            True,
            64,
            20,
            120,
        )
        assert cfg.hydra.sweep.dir == "results/findings/table2_decisive"
        if cfg.reference._target_.endswith("EWMAReferenceSource"):
            betas[experiment] = cfg.reference.beta
    # The two readings of the paper's beta = W/(W+2): W = the gap cap (null: computed, 3/5) and 0.75 (W = 6).
    assert betas == {"ppo_ewma": None, "ppo_ewma_beta075": 0.75}
    assert cfg.rollout.max_version_gap == 3


def test_the_suites_libyaml_loader_reads_every_shipped_config_as_omegaconfs_own_does():
    import omegaconf._utils
    import yaml

    from tests.support.libyaml_configs import libyaml_loader

    files = sorted(Path(CONFIG_DIR).glob("**/*.yaml"))
    assert len(files) >= 100
    # The test session's `get_yaml_loader` gives the C loader; OmegaConf's own is kept as `__wrapped__`.
    python_loader = omegaconf._utils.get_yaml_loader.__wrapped__()
    c_loader = libyaml_loader(python_loader)
    assert issubclass(omegaconf._utils.get_yaml_loader(), yaml.CSafeLoader)
    for path in files:
        text = path.read_text()
        assert yaml.load(text, Loader=c_loader) == yaml.load(text, Loader=python_loader), path
    with pytest.raises(yaml.constructor.ConstructorError, match="found duplicate key lr"):
        yaml.load("lr: 1\nlr: 2\n", Loader=c_loader)
    # OmegaConf's floats (1e-5 without a dot) and no timestamps, in both.
    for loader in (c_loader, python_loader):
        assert yaml.load("lr: 1e-5\nday: 2026-12-06\n", Loader=loader) == {"lr": 1e-05, "day": "2026-12-06"}
