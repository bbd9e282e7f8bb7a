"""Messages name a setting as the front end in use spells it (`lit_asyncrl.config_keys`)."""

import pytest

from lit_asyncrl.config_keys import config_key, forwarded_keys, keys_spelled_as
from lit_asyncrl.datamodule import RolloutDataModule
from tests.test_configs import compose_train


def test_the_hydra_config_spells_the_datamodules_arguments_under_rollout(tmp_path):
    spelling = forwarded_keys(compose_train([f"hydra.run.dir={tmp_path}"]))
    assert spelling["data.max_model_len"] == "rollout.max_model_len"
    assert spelling["data.kv_cache_fraction"] == "rollout.kv_cache_fraction"
    assert (spelling["data.seed"], spelling["data.model_path"], spelling["data.env"]) == ("seed", "model.path", "env")
    assert "data.top_k" not in spelling  # no Hydra key forwards it: a Hydra user writes data.top_k


def test_a_spelling_holds_inside_its_block_only():
    assert config_key("data.max_model_len") == "data.max_model_len"  # the CLI's path by default
    with keys_spelled_as({"data.max_model_len": "rollout.max_model_len"}):
        assert config_key("data.max_model_len") == "rollout.max_model_len"
        assert config_key("data.top_k") == "data.top_k"  # not forwarded: written as data.top_k
        with (
            pytest.raises(ValueError, match=r"^rollout\.temperature must be > 0") as raised,
            keys_spelled_as({"data.temperature": "rollout.temperature"}),
        ):
            RolloutDataModule(temperature=0.0)
        assert "data.temperature" not in str(raised.value)
        assert config_key("data.max_model_len") == "rollout.max_model_len"  # the outer block's again
    assert config_key("data.max_model_len") == "data.max_model_len"
