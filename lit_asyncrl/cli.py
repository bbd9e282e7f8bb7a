"""Lightning CLI entry: `lit-asyncrl fit --config conf/cli/default.yaml`, plus `lit-asyncrl bounds`."""

from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningCLI

from lit_asyncrl.datamodule import RolloutDataModule
from lit_asyncrl.module import AsyncRLModule


class AsyncRLCLI(LightningCLI):
    """The module and the engine must serve the same model: `model.model_path` feeds `data.model_path`."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.model_path", "data.model_path")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bounds"]:
        from lit_asyncrl.losses.bounds_table import main as bounds_main

        raise SystemExit(bounds_main(argv[1:]))
    AsyncRLCLI(AsyncRLModule, RolloutDataModule, args=argv, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
