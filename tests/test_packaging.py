"""A non-editable install carries the Hydra configs: the wheel ships conf/ as `lit_asyncrl_conf`.

Builds a wheel of the main distribution from a copy of the sources, installs it into a folder with
`pip install --target`, and runs the Hydra entry from another directory with only that folder on
PYTHONPATH. No engine starts: `--cfg job` prints the composed config and exits.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What the wheel is built from. Building from a copy leaves no build/ or *.egg-info in the checkout,
# and no stale build/lib from an earlier build can leak deleted modules into the wheel.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "lit_asyncrl", "conf")
TIMEOUT_S = 180


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("setuptools")  # --no-build-isolation builds with the environment's setuptools
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("wheelhouse")
    done = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."], cwd=src
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("lit_asyncrl-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    done = _run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)], cwd=target
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _env(site: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "HYDRA"))}
    env["PYTHONPATH"] = str(site)
    return env


def test_wheel_carries_every_config_and_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {
        f"lit_asyncrl_conf/{path.relative_to(ROOT / 'conf').as_posix()}" for path in (ROOT / "conf").rglob("*.yaml")
    }
    modules = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "lit_asyncrl").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert "lit_asyncrl_conf/train.yaml" in names
    assert configs - names == set(), "configs missing from the wheel"
    assert modules - names == set(), "modules missing from the wheel (is the subpackage found by setup.py?)"


def test_installed_wheel_runs_hydra_entry_from_elsewhere(site: Path, tmp_path: Path) -> None:
    env = _env(site)
    where = _run(
        [
            sys.executable,
            "-c",
            "import lit_asyncrl; from lit_asyncrl.config_dir import config_dir; print(lit_asyncrl.__file__); print(config_dir())",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    module_file, conf = where.stdout.split()
    # The copy from the wheel is used, not the editable checkout, and its configs come with it.
    assert Path(module_file).resolve().is_relative_to(site.resolve())
    assert Path(conf).resolve().is_relative_to(site.resolve())
    assert (Path(conf) / "train.yaml").is_file()

    job = _run([sys.executable, "-m", "lit_asyncrl.train", "--cfg", "job"], cwd=tmp_path, env=env)
    assert job.returncode == 0, job.stdout + job.stderr
    # At least the module's and the datamodule's targets; the exact config keeps changing.
    targets = re.findall(r"^\s*_target_:\s*lit_asyncrl\.\S+", job.stdout, flags=re.MULTILINE)
    assert len(targets) >= 2, job.stdout
    assert not any(tmp_path.iterdir()), "`--cfg job` wrote into the working directory"
