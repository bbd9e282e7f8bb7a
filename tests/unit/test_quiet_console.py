"""What the entry points keep off the console: known warnings and Lightning's cloud-logger tip."""

from __future__ import annotations

import logging

from lit_asyncrl.lifecycle import quiet_known_warnings


def test_lightnings_cloud_logger_tip_is_dropped_and_its_other_messages_kept(caplog):
    quiet_known_warnings()
    quiet_known_warnings()  # twice: one filter, not two
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    assert len(logger.filters) == 2  # the tip's and the own bar's note's
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


def test_the_cli_offers_fit_and_validate_and_reads_its_command_line_once(monkeypatch, capsys):
    import sys
    import warnings

    import pytest

    from lit_asyncrl.cli import main

    monkeypatch.setattr(sys, "argv", ["lit-asyncrl", "--help"])
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit):
        warnings.simplefilter("always")
        main()
    help_text = capsys.readouterr().out
    assert "{fit,validate}" in help_text and "predict" not in help_text
    # Handed sys.argv a second time, Lightning warned at every start that it got both.
    assert not [w for w in caught if "args parameter is intended" in str(w.message)]


def test_a_streams_progress_bar_names_its_phase_not_an_epoch_count():
    import lightning as L
    from lightning.pytorch.callbacks import RichProgressBar

    from lit_asyncrl.progress_bar import PhaseProgressBar, stream_progress_bar

    (bar,) = stream_progress_bar("RL")
    assert isinstance(bar, PhaseProgressBar) and isinstance(bar, RichProgressBar)  # replaces Lightning's default bar
    # Padded to the validation line's width ("Validation", 10 characters), like Lightning's own.
    assert bar._get_train_description(current_epoch=0) == "RL        "
    # None where the bar is off, or where the trainer has a bar of the user's own choosing.
    assert stream_progress_bar("Warm start", enabled=False) == []
    assert stream_progress_bar("RL", L.Trainer(enable_progress_bar=False, logger=False)) == []
    own = L.pytorch.callbacks.TQDMProgressBar()
    assert stream_progress_bar("RL", L.Trainer(callbacks=[own], logger=False)) == []
    assert len(stream_progress_bar("RL", L.Trainer(logger=False))) == 1  # Lightning's default rich bar


def test_lightnings_note_on_a_non_empty_log_dir_is_replaced_by_ours(tmp_path):
    import warnings

    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from lit_asyncrl.before_fit import warn_of_replaced_metrics

    quiet_known_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_known_warnings()
        (tmp_path / ".hydra").mkdir()
        trainer = L.Trainer(
            logger=CSVLogger(tmp_path, name="", version=""), enable_progress_bar=False, enable_model_summary=False
        )
        warn_of_replaced_metrics(trainer)  # a fresh run dir: nothing to say
        trainer.logger.log_metrics({"a": 1.0}, step=0)
        trainer.logger.save()
        assert not [w for w in caught if "exists and is not empty" in str(w.message)]
        assert not caught or all("earlier run" not in str(w.message) for w in caught)
        warn_of_replaced_metrics(trainer)
    assert [str(w.message) for w in caught if "earlier run" in str(w.message)] == [
        f"{tmp_path / 'metrics.csv'} holds an earlier run's metrics; this run replaces them"
    ]


def test_lightnings_note_that_the_phase_bar_replaces_its_own_is_dropped_in_a_real_fit(caplog):
    """A module whose `configure_callbacks` puts the phase bar in place of the trainer's default rich bar
    (as `AsyncRLModule` does): Lightning's note on the override stays off the console; a note naming
    another callback of the trainer's is kept."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    from lit_asyncrl.progress_bar import stream_progress_bar

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(1))

        def training_step(self, batch, batch_idx):
            return (self.weight * batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def configure_callbacks(self):
            return stream_progress_bar("RL", self.trainer)

    quiet_known_warnings()
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    other = (
        "The following callbacks returned in `LightningModule.configure_callbacks` will override existing callbacks "
        "passed to Trainer: ModelCheckpoint, RichProgressBar"
    )
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False)
    with caplog.at_level(logging.INFO, logger=logger.name):
        trainer.fit(Module(), DataLoader(torch.ones(2, 1), batch_size=1))
        logger.info(other)
    assert isinstance(trainer.progress_bar_callback, type(stream_progress_bar("RL")[0]))  # the override happened
    assert [record.getMessage() for record in caplog.records if "configure_callbacks" in record.getMessage()] == [other]
