"""raysent.config.METHOD_NAMES lists the registered methods without importing them (config errors before torch): it
must be the registry itself, in the same order."""

from __future__ import annotations

from raysent.config import METHOD_NAMES
from raysent.methods import METHODS


def test_the_torch_free_names_are_the_registry_in_its_order():
    assert tuple(METHODS) == METHOD_NAMES
