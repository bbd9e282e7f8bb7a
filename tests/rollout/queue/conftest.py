"""The fake engines' fixture (`tests/support/fakes.py`) for the producer and group-filter tests."""

from tests.support.fakes import engines  # noqa: F401 (a fixture)
