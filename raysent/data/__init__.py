"""Data: named data sets (local folder first, hub second), readers and batching."""

from raysent.data.datasets import (
    DATASETS,
    STS_TASKS,
    Data,
    NLIPairs,
    ScoredPairs,
    Sentences,
    Triplets,
    load,
    parse_spec,
    validate_spec,
)

__all__ = [
    "DATASETS",
    "STS_TASKS",
    "Data",
    "NLIPairs",
    "ScoredPairs",
    "Sentences",
    "Triplets",
    "load",
    "parse_spec",
    "validate_spec",
]
