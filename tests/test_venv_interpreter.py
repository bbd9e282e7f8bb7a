"""`tools/venv_interpreter.py`: which interpreter `make venv` makes a new .venv from."""

import dataclasses
import os
import shutil
import subprocess
import sys

import pytest

from tools.venv_interpreter import Interpreter, chosen, described, loads_shared_libpython

#: pyenv's default build: no profile-guided optimisation, libpython loaded from a shared library.
PYENV = Interpreter("/opt/pyenv/3.11.7/bin/python3.11", (3, 11), False, True, True)
#: A distribution's build: libpython in the executable, ensurepip installed.
DEBIAN = Interpreter("/usr/bin/python3.11", (3, 11), False, True, False)


def test_an_unoptimised_shared_build_gives_way_to_the_systems_static_one_of_its_version():
    assert chosen(PYENV, DEBIAN) == DEBIAN


@pytest.mark.parametrize(
    ("own", "system"),
    [
        (dataclasses.replace(PYENV, shared_libpython=False), DEBIAN),  # python3 links libpython in itself
        (dataclasses.replace(PYENV, optimised=True), DEBIAN),  # built with --enable-optimizations
        (PYENV, None),  # no /usr/bin/python3
        (PYENV, dataclasses.replace(DEBIAN, version=(3, 12))),  # another version: other wheels
        (PYENV, dataclasses.replace(DEBIAN, shared_libpython=True)),
        (PYENV, dataclasses.replace(DEBIAN, makes_venvs=False)),  # Debian without python3.11-venv
    ],
    ids=["static python3", "optimised python3", "no system python", "other version", "shared system", "no ensurepip"],
)
def test_python3_is_kept_otherwise(own, system):
    assert chosen(own, system) == own


def test_an_interpreter_describes_itself():
    found = described(sys.executable)
    assert found.path == os.path.realpath(sys.executable)
    assert found.version == tuple(sys.version_info[:2])
    assert described("/nonexistent/python3") is None


def libpython_mapped(executable: str) -> bool:
    """Told another way than by `ldd`: whether a process of `executable` has a libpython mapped."""
    mapped = "print(any('libpython' in line for line in open('/proc/self/maps')))"
    return subprocess.run([executable, "-c", mapped], capture_output=True, text=True, check=True).stdout == "True\n"


def test_ldd_tells_a_shared_libpython_from_a_static_one():
    if not os.path.exists("/proc/self/maps") or shutil.which("ldd") is None:
        pytest.skip("needs ldd and /proc")
    # This machine's interpreters, whichever they are (here pyenv's, shared, and Debian's, static);
    # each asked for its executable, as `python3` may be a launcher script (pyenv's shim).
    named = [sys.executable, shutil.which("python3"), "/usr/bin/python3"]
    found = [described(path) for path in named if path is not None]
    for executable in sorted({interpreter.path for interpreter in found if interpreter is not None}):
        assert loads_shared_libpython(executable) == libpython_mapped(executable), executable
    assert loads_shared_libpython("/nonexistent/python3") is False
