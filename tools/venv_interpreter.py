"""Prints the Python interpreter that `make venv` makes .venv from.

It is the `python3` that runs this script, unless that one loads libpython from a shared library
and /usr/bin/python3 is the same Python version with libpython linked into its executable: then it
is /usr/bin/python3. An interpreter built with `--enable-shared` (pyenv's default build, for one)
calls its own functions through the shared library's symbol table, and distributions build their
/usr/bin/python3 with profile-guided optimisation: on a 2-core machine one Hydra composition of the
shipped configs took 0.1575 s under pyenv's Python 3.11.7 and 0.1178 s under Debian's 3.11.2
(medians of 5 alternating rounds, `benchmarks/bench_interpreters.py`). Training and the tests spend
much of their time in pure Python (Hydra, OmegaConf, Lightning's loop, pytest).
"""

import os
import subprocess
import sys

SYSTEM_PYTHON = "/usr/bin/python3"


def loads_shared_libpython(executable: str) -> bool:
    """Whether `executable` loads libpython at its start (False where `ldd` cannot tell)."""
    try:
        linked = subprocess.run(["ldd", executable], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "libpython" in linked


def version_of(executable: str) -> str:
    command = [executable, "-c", "import sys; print(sys.version_info[:2])"]
    return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()


def venv_interpreter() -> str:
    own = os.path.realpath(sys.executable)
    if not loads_shared_libpython(own) or not os.access(SYSTEM_PYTHON, os.X_OK):
        return own
    system = os.path.realpath(SYSTEM_PYTHON)
    if loads_shared_libpython(system) or version_of(system) != str(sys.version_info[:2]):
        return own
    return system


if __name__ == "__main__":
    print(venv_interpreter())
