"""The package list only; everything else is in pyproject.toml.

pyproject.toml can either discover packages or list them, not both, and `lit_asyncrl_conf` (the import
name under which the top-level conf/ folder is installed, see [tool.setuptools] package-dir and
package-data there) is not found by discovery. conf/'s subfolders are listed too (as namespace
packages) so that a new config group ships without an edit here and setuptools does not warn.
"""

from setuptools import find_namespace_packages, setup

SKIP = ["*__pycache__*"]
code = find_namespace_packages(include=["lit_asyncrl", "lit_asyncrl.*"], exclude=SKIP)
configs = [
    "lit_asyncrl_conf",
    *(f"lit_asyncrl_conf.{name}" for name in find_namespace_packages(where="conf", exclude=SKIP)),
]

setup(packages=[*code, *configs])
