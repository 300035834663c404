"""Evaluation: STS, SentEval transfer, semantic search, geometry, STS17. Imports no Ray and no MLflow.

:func:`evaluate_tasks` (raysent.eval.suite) runs any of them through one embedding cache; every evaluator
returns a typed result (:mod:`raysent.eval.results`). The names below are imported when first used, so that
reading a result type (``raysent.eval.results``, as the run records do) does not load scipy and the evaluators.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysent.eval.results import Evaluation
    from raysent.eval.sts import evaluate_dev, evaluate_sts, format_table
    from raysent.eval.suite import EVAL_TASKS, evaluate_tasks

__all__ = ["EVAL_TASKS", "Evaluation", "evaluate_dev", "evaluate_sts", "evaluate_tasks", "format_table"]

_WHERE = {"Evaluation": "raysent.eval.results", "evaluate_dev": "raysent.eval.sts",
          "evaluate_sts": "raysent.eval.sts", "format_table": "raysent.eval.sts", "EVAL_TASKS": "raysent.eval.suite",
          "evaluate_tasks": "raysent.eval.suite"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'raysent.eval' has no attribute {name!r}")
