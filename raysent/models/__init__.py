"""Encoder wrapper (all hidden states), poolings and heads. Imports no Ray and no MLflow."""

from raysent.models.encoder import Encoder, resolve_model
from raysent.models.pooling import BASE_POOLINGS, inference_pooling, is_valid_pooling, pool

__all__ = ["BASE_POOLINGS", "Encoder", "inference_pooling", "is_valid_pooling", "pool", "resolve_model"]
