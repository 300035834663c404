"""Evaluation (STS first). Imports no Ray and no MLflow."""

from raysent.eval.sts import evaluate_dev, evaluate_sts, format_table

__all__ = ["evaluate_dev", "evaluate_sts", "format_table"]
