"""Prints the Python interpreter that `make venv` makes a new .venv from.

It is the `python3` that runs this script, unless that one is a build without profile-guided
optimisation that loads libpython from a shared library, and /usr/bin/python3 is the same minor
version (the patch release may be older), links libpython into its executable and can make a venv:
then it is /usr/bin/python3. An interpreter built with `--enable-shared` alone (pyenv's default
build on Linux, for one) calls its own functions through the shared library's symbol table, while
distributions build /usr/bin/python3 with profile-guided optimisation: on a 2-core machine one Hydra
composition of the shipped configs took 0.1575 s under pyenv's Python 3.11.7 and 0.1178 s under
Debian's 3.11.2 (medians of 5 alternating rounds, `benchmarks/bench_interpreters.py`). Training
and the tests spend much of their time in pure Python (Hydra, OmegaConf, Lightning's loop, pytest).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

SYSTEM_PYTHON = "/usr/bin/python3"

#: Run by each candidate interpreter: the facts `Interpreter` holds, but the shared library's.
DESCRIBE = """
import importlib.util, json, os, sys, sysconfig
print(json.dumps({
    "path": os.path.realpath(sys.executable),
    "version": list(sys.version_info[:2]),
    "optimised": "--enable-optimizations" in (sysconfig.get_config_var("CONFIG_ARGS") or ""),
    "makes_venvs": importlib.util.find_spec("ensurepip") is not None,
}))
"""


@dataclasses.dataclass(frozen=True)
class Interpreter:
    path: str
    version: tuple[int, int]
    #: Built with `--enable-optimizations` (profile-guided optimisation).
    optimised: bool
    #: Has ensurepip, which `-m venv` needs (Debian ships it apart, in python3.X-venv).
    makes_venvs: bool
    #: Loads libpython from a shared library at its start.
    shared_libpython: bool


def loads_shared_libpython(executable: str) -> bool:
    """Whether `executable` loads libpython at its start (False where `ldd` cannot tell)."""
    try:
        linked = subprocess.run(["ldd", executable], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "libpython" in linked


def described(executable: str) -> Interpreter | None:
    """What `executable` is, asked of it; None where it does not run."""
    try:
        result = subprocess.run([executable, "-c", DESCRIBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    facts = json.loads(result.stdout)
    return Interpreter(
        path=facts["path"],
        version=tuple(facts["version"]),
        optimised=facts["optimised"],
        makes_venvs=facts["makes_venvs"],
        shared_libpython=loads_shared_libpython(facts["path"]),
    )


def chosen(own: Interpreter, system: Interpreter | None) -> Interpreter:
    """`system` where `own` is an unoptimised build on a shared libpython and `system` is of its
    minor version, links libpython in and makes venvs; `own` otherwise."""
    if system is None or own.optimised or not own.shared_libpython:
        return own
    if system.shared_libpython or system.version != own.version or not system.makes_venvs:
        return own
    return system


if __name__ == "__main__":
    own = described(sys.executable)
    print(chosen(own, described(SYSTEM_PYTHON)).path if own is not None else sys.executable)
