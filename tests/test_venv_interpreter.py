"""`tools/venv_interpreter.py`: which interpreter `make venv` makes .venv from."""

import os
import sys

from tools import venv_interpreter

OWN = os.path.realpath(sys.executable)
SYSTEM = "/usr/bin/python3.11"


def choose(monkeypatch, shared: set[str], versions: dict[str, str]) -> str:
    """The choice on a machine whose interpreters load libpython shared where named in `shared`
    and are of `versions` (the system's; the running one is of its own)."""
    monkeypatch.setattr(venv_interpreter, "loads_shared_libpython", lambda executable: executable in shared)
    monkeypatch.setattr(venv_interpreter, "version_of", lambda executable: versions[executable])
    monkeypatch.setattr(
        venv_interpreter.os.path, "realpath", lambda path: SYSTEM if path == "/usr/bin/python3" else OWN
    )
    monkeypatch.setattr(venv_interpreter.os, "access", lambda path, mode: path == "/usr/bin/python3")
    return venv_interpreter.venv_interpreter()


def test_a_shared_libpython_gives_way_to_the_systems_static_one_of_the_same_version(monkeypatch):
    assert choose(monkeypatch, shared={OWN}, versions={SYSTEM: str(sys.version_info[:2])}) == SYSTEM


def test_a_static_python3_is_kept(monkeypatch):
    assert choose(monkeypatch, shared=set(), versions={SYSTEM: str(sys.version_info[:2])}) == OWN


def test_a_system_python_of_another_version_or_also_shared_is_not_taken(monkeypatch):
    assert choose(monkeypatch, shared={OWN}, versions={SYSTEM: "(3, 9)"}) == OWN
    assert choose(monkeypatch, shared={OWN, SYSTEM}, versions={SYSTEM: str(sys.version_info[:2])}) == OWN


def test_ldd_tells_a_shared_libpython_from_a_static_one():
    # Told apart another way: whether this very process has a libpython shared object mapped.
    with open("/proc/self/maps") as maps:
        mapped = any("libpython" in line for line in maps)
    assert venv_interpreter.loads_shared_libpython(OWN) == mapped
    assert venv_interpreter.loads_shared_libpython("/nonexistent/python3") is False
