"""raysent: train, tune and compare contrastive sentence-embedding methods at scale.

The core (:mod:`raysent.config`, :mod:`raysent.data`, :mod:`raysent.models`, :mod:`raysent.methods`,
:mod:`raysent.eval`, :mod:`raysent.train` without ``ray_train``) needs only torch; the orchestration
over it (:mod:`raysent.train.ray_train`, :mod:`raysent.tune`, :mod:`raysent.tracking`,
:mod:`raysent.report`, :mod:`raysent.bench`, :mod:`raysent.cli`) adds Ray Train, Ray Tune, Optuna and
MLflow. tests/test_layers.py checks the split.

From Python: ``raysent.search``, ``raysent.fit``, ``raysent.evaluate`` and ``raysent.load`` (:mod:`raysent.api`,
docs/python-api.md), imported when first used so that ``import raysent`` stays light.
"""

from __future__ import annotations

from typing import Any

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).

__version__ = "0.2.0.dev0"

_API = ("search", "fit", "evaluate", "load", "SearchResult", "EvalResult", "SentenceEncoder")


def __getattr__(name: str) -> Any:
    if name in _API:
        from raysent import api

        return getattr(api, name)
    raise AttributeError(f"module 'raysent' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
