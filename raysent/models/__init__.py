"""Encoder wrapper (all hidden states), poolings and heads. Imports no Ray and no MLflow.

The names below are imported when first used: ``raysent.models.pooling``'s names and checks need no torch, so
a command can refuse a bad pooling before torch loads (``raysent export --pooling``)."""

from __future__ import annotations

from typing import Any

_FROM = {"Encoder": "raysent.models.encoder", "resolve_model": "raysent.models.locate",
         "BASE_POOLINGS": "raysent.models.pooling", "inference_pooling": "raysent.models.pooling",
         "is_valid_pooling": "raysent.models.pooling", "pool": "raysent.models.pooling"}


def __getattr__(name: str) -> Any:
    if name in _FROM:
        import importlib

        return getattr(importlib.import_module(_FROM[name]), name)
    raise AttributeError(f"module 'raysent.models' has no attribute {name!r}")


__all__ = ["BASE_POOLINGS", "Encoder", "inference_pooling", "is_valid_pooling", "pool", "resolve_model"]
