"""The registered methods, by name: each spec of :mod:`raysent.methods.spec` (the one registry, ``SPECS``, in
`raysent methods`' order) with the model its ``implementation`` names (imports torch)."""

from __future__ import annotations

import importlib

from raysent.methods.base import Method
from raysent.methods.spec import SPECS, MethodSpec, get_spec


def _implementation(spec: type[MethodSpec]) -> type[Method]:
    module, _, name = spec.implementation.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (issubclass(cls, spec) and issubclass(cls, Method)):
        raise TypeError(f"{spec.implementation}: the method {spec.name!r} must subclass {spec.__name__} and Method")
    return cls


METHODS: dict[str, type[Method]] = {name: _implementation(spec) for name, spec in SPECS.items()}


def get_method(name: str) -> type[Method]:
    get_spec(name)  # an unknown name: the one error, which lists the allowed names
    return METHODS[name]
