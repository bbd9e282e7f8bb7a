"""What the entry points keep off the console: known warnings and Lightning's cloud-logger tip."""

from __future__ import annotations

import logging

from lit_asyncrl.lifecycle import quiet_known_warnings


def test_lightnings_cloud_logger_tip_is_dropped_and_its_other_messages_kept(caplog):
    quiet_known_warnings()
    quiet_known_warnings()  # twice: one filter, not two
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    assert len(logger.filters) == 1
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info(
            "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](https://pypi.org/project/litlogger/)"
        )
        logger.info("GPU available: False, used: False")
    assert [record.getMessage() for record in caplog.records] == ["GPU available: False, used: False"]


def test_transformers_loading_bar_is_off():
    from transformers.utils import logging as transformers_logging

    transformers_logging.enable_progress_bar()
    quiet_known_warnings()
    assert not transformers_logging.is_progress_bar_enabled()
