"""Messages name a setting as the front end in use spells it (`lit_asyncrl.config_keys`)."""

import pytest

from lit_asyncrl.config_keys import config_key, keys_spelled_as
from lit_asyncrl.rollout.settings import RolloutConfig, cli_paths


def test_a_key_is_its_hydra_key_unless_a_front_end_spells_it_otherwise():
    assert config_key("rollout.max_model_len") == "rollout.max_model_len"
    assert config_key("model.path") == "model.path"
    with keys_spelled_as(cli_paths()):
        assert config_key("rollout.max_model_len") == "data.rollout.engine.max_model_len"
        assert config_key("model.path") == "model.path"  # no prefix of the spelling: as it is
        assert config_key("rolloutx.y") == "rolloutx.y"  # a prefix ends at its dot
        assert config_key("rollout.lora.rank") == "data.rollout.engine.lora.rank"  # a key's own keys follow it
        assert config_key("rollout.top_kx") == "rollout.top_kx"  # a key is a prefix up to a dot only


def test_a_spelling_holds_inside_its_block_only():
    with keys_spelled_as(cli_paths()):
        with pytest.raises(ValueError, match=r"^data\.rollout\.batch\.temperature must be > 0, got 0\.0$"):
            RolloutConfig.from_keys(temperature=0.0)
        with keys_spelled_as({"rollout.": "outer.rollout."}):
            assert config_key("rollout.top_k") == "outer.rollout.top_k"
        assert config_key("rollout.top_k") == "data.rollout.batch.top_k"  # the outer block's again
    assert config_key("rollout.top_k") == "rollout.top_k"
    with pytest.raises(ValueError, match=r"^rollout\.temperature must be > 0, got 0\.0$"):
        RolloutConfig.from_keys(temperature=0.0)
