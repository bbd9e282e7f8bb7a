"""Where the Hydra configs are: the top-level `conf/` folder, installed as the package `lit_asyncrl_conf`.

`conf/` stays at the top of the repository; pyproject.toml maps the import name `lit_asyncrl_conf` onto
it (package-dir) and ships every YAML file under it (package-data), so an editable install points at
the checkout's `conf/` and a wheel carries a copy. Use it as `hydra.main(config_path=config_dir(), ...)`
or `initialize_config_dir(config_dir=config_dir())`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

CONFIG_PACKAGE = "lit_asyncrl_conf"
PRIMARY_CONFIG = "train.yaml"


def config_dir() -> str:
    """The absolute path of the installed conf/ directory (the folder that holds `train.yaml`).

    Installed packages (wheel or editable) resolve through importlib.resources; a source tree on
    PYTHONPATH without an install falls back to the `conf/` beside the `lit_asyncrl` folder.
    """
    for folder in _candidates():
        if (folder / PRIMARY_CONFIG).is_file():
            return str(folder.resolve())
    raise FileNotFoundError(
        f"no {PRIMARY_CONFIG}: {CONFIG_PACKAGE} is not installed as a directory and conf/ is not beside lit_asyncrl"
    )


def _candidates() -> Iterator[Path]:
    try:
        package = importlib.import_module(CONFIG_PACKAGE)
    except ModuleNotFoundError:
        package = None
    if package is not None:
        try:
            # conf/ has no __init__.py, so this is a namespace package: files() gives a MultiplexedPath
            # whose str() is no path, hence joinpath(...).parent.
            primary = resources.files(package).joinpath(PRIMARY_CONFIG)
            if isinstance(primary, Path):
                yield primary.parent
        except NotADirectoryError:
            # Python 3.11 with setuptools' editable finder: __path__ also holds a placeholder entry,
            # which MultiplexedPath refuses; the real directories are still listed in __path__.
            pass
        yield from (Path(entry) for entry in getattr(package, "__path__", ()))
    yield Path(__file__).resolve().parent.parent / "conf"
