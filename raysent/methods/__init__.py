"""Every published method, one file each, registered by name. Imports no Ray and no MLflow.

Importing this package imports no torch either: the descriptions (:mod:`raysent.methods.spec`: names,
hyperparameters, the papers' defaults) are read by ``raysent.config`` before any model is needed, and the
methods themselves (:mod:`raysent.methods.registry`) load with their first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from raysent.methods.spec import SPECS, MethodParams, MethodSpec, get_spec

if TYPE_CHECKING:
    from raysent.methods.base import Gatherer, LossOutput, Method
    from raysent.methods.registry import METHODS, get_method

_LAZY = {"Gatherer": "raysent.methods.base", "LossOutput": "raysent.methods.base", "Method": "raysent.methods.base",
         "METHODS": "raysent.methods.registry", "get_method": "raysent.methods.registry"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["METHODS", "SPECS", "Gatherer", "LossOutput", "Method", "MethodParams", "MethodSpec", "get_method",
           "get_spec"]
