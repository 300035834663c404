"""Evaluation: STS, SentEval transfer, semantic search, geometry, STS17. Imports no Ray and no MLflow.

:func:`evaluate_tasks` (raysent.eval.suite) runs any of them through one embedding cache.
"""

from raysent.eval.sts import evaluate_dev, evaluate_sts, format_table
from raysent.eval.suite import EVAL_TASKS, evaluate_tasks

__all__ = ["EVAL_TASKS", "evaluate_dev", "evaluate_sts", "evaluate_tasks", "format_table"]
