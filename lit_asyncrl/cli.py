"""Lightning CLI entry: `lit-asyncrl fit --config conf/cli/default.yaml`, plus `lit-asyncrl bounds`,
`lit-asyncrl report RUN_DIRS... --out DIR` (figures and a table over a sweep's runs) and
`lit-asyncrl export CKPT --out DIR` (the trained policy as a folder vLLM, transformers and peft load).

`model.loss` and `model.reference` are typed (`class_path` + `init_args`, checked by jsonargparse);
`warm_start` is the supervised phase that runs before the fit (skipped with `--ckpt_path`).
"""

from __future__ import annotations

import sys

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI

from lit_asyncrl.before_fit import check_settings, launch_and_warm_start
from lit_asyncrl.config_keys import keys_spelled_as
from lit_asyncrl.datamodule import RolloutDataModule
from lit_asyncrl.lifecycle import quiet_known_warnings, sigterm_raises
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.rollout.settings import cli_paths
from lit_asyncrl.warm_start import WarmStart

#: The commands `main` answers before Lightning's parser, named in `lit-asyncrl --help`.
OTHER_COMMANDS = (
    "Other commands: lit-asyncrl bounds (Proposition 1's effective bounds), "
    "lit-asyncrl report RUN_DIRS... --out DIR (a table and figures over runs), "
    "lit-asyncrl export CKPT --out DIR (the trained policy as a Hugging Face folder); each takes --help."
)


class AsyncRLCLI(LightningCLI):
    """The module and the engine serve the same model: `model.model_path` feeds `data.model_path`.

    The snapshot reference's window follows `data.rollout.batch.max_version_gap` unless its `max_staleness` is set.
    """

    def __init__(self, *args, **kwargs) -> None:
        # Everything the CLI does (parsing, building, fitting) happens in here: its messages name
        # the CLI's paths (`data.rollout.engine.max_model_len`).
        with keys_spelled_as(cli_paths()):
            super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # Only what a run of this library does: train, or evaluate a checkpoint on held-out instances.
        return {key: skipped for key, skipped in LightningCLI.subcommands().items() if key in ("fit", "validate")}

    def parse_arguments(self, parser, args) -> None:
        if isinstance(args, (dict, Namespace)):
            super().parse_arguments(parser, args)
            return
        given = sys.argv[1:] if args is None else list(args)
        self.config = parser.parse_args(tasks_start_from_their_defaults(given))

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.model_path", "data.model_path")
        parser.add_class_arguments(WarmStart, "warm_start")

    def before_fit(self) -> None:
        check_settings(self.model, self.datamodule, self.trainer)
        resumed = self.config[self.subcommand].get("ckpt_path") is not None
        warm_start = self.config_init[self.subcommand]["warm_start"]
        launch_and_warm_start(self.model, self.datamodule, warm_start, self.trainer, resumed)


ENV_CLASS_FLAGS = ("--data.env", "--data.env.class_path")


def tasks_start_from_their_defaults(args: list[str]) -> list[str]:
    """A task class named on the command line starts from its own defaults.

    jsonargparse keeps the previous class's `init_args` that the new class also accepts: with
    `--config conf/cli/default.yaml --data.env my_module.MyTask`, guess-the-number's `max_turns`,
    `held_out` or `malformed_reward` would silently become MyTask's. A `--data.env null` before each
    such flag drops them (settings given after it still apply).
    """
    out: list[str] = []
    for index, arg in enumerate(args):
        flag, separator, value = arg.partition("=")
        if not separator:
            value = args[index + 1] if index + 1 < len(args) else ""
        if flag in ENV_CLASS_FLAGS and _names_a_class(value):
            out += ["--data.env", "null"]
        out.append(arg)
    return out


def _names_a_class(value: str) -> bool:
    return bool(value) and not value.startswith(("{", "-")) and value not in ("null", "None")


def main(argv: list[str] | None = None) -> None:
    given = argv
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bounds"]:
        from lit_asyncrl.losses.bounds_table import main as bounds_main

        raise SystemExit(bounds_main(argv[1:]))
    if argv[:1] == ["report"]:
        from lit_asyncrl.report.main import main as report_main

        raise SystemExit(report_main(argv[1:]))
    if argv[:1] == ["export"]:
        from lit_asyncrl.export.main import main as export_main

        raise SystemExit(export_main(argv[1:]))
    # Lightning closes the rollout service on teardown and on any exception (the datamodule's
    # on_exception); SIGTERM is turned into such an exception.
    quiet_known_warnings()
    with sigterm_raises():
        # `args=None` reads the command line itself: handing it `sys.argv` again makes Lightning warn
        # that it was given both.
        AsyncRLCLI(
            AsyncRLModule,
            RolloutDataModule,
            args=given,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"epilog": OTHER_COMMANDS},
        )


if __name__ == "__main__":
    main()
