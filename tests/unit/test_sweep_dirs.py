"""Sweep jobs' folder names (`lit_asyncrl/sweep_dirs.py`)."""

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lit_asyncrl.config_dir import config_dir
from lit_asyncrl.sweep_dirs import MAX_NAME_BYTES, job_dirname, register_resolver


def test_a_short_name_is_hydras_own():
    assert job_dirname(3, "loss=cispo,seed=1") == "3_loss=cispo,seed=1"


def test_a_long_name_is_cut_with_a_hash_of_all_its_overrides():
    common = ",".join(f"rollout.key_{index}={index}" for index in range(20))  # 320 characters
    first, second = job_dirname(0, f"{common},seed=0"), job_dirname(0, f"{common},seed=1")
    assert len(first.encode()) == len(second.encode()) == MAX_NAME_BYTES
    assert first.startswith("0_rollout.key_0=0,rollout.key_1=1,")
    assert first != second  # they differ only past the cut: the hash tells them apart
    assert first[:-11] == second[:-11] and first[-11] == "_"


def test_the_sweep_subdir_of_the_training_config_resolves_to_it(tmp_path):
    register_resolver()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["seed=1"], return_hydra_config=True)
    cfg.hydra.job.num = 7
    cfg.hydra.job.override_dirname = "seed=1"
    assert OmegaConf.to_container(cfg.hydra.sweep, resolve=True)["subdir"] == "7_seed=1"
