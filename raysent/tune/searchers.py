"""The search phase's searcher: ``search.algorithm`` as Tune's search algorithm, or a grid.

Optuna's multivariate TPE (``optuna-tpe``, seeded, the default; ``optuna`` is its earlier name), its GPSampler
(``optuna-gp``) or its random sampler (:func:`sampler_of`), each through ``ray.tune.search.optuna.OptunaSearch``
with a define-by-run space (conditional entries), the Optuna study kept in ``results/<experiment>/optuna.db``; or
``grid`` (Tune's ``grid_search``). The warm-start configuration is tried first
(:class:`~raysent.tune.plan.SearchPlan`). ``search.seeds`` > 1 without a scheduler wraps the searcher in Tune's
``Repeater`` (each suggestion once per seed; the searcher is told the mean).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysent.config import ExperimentConfig
from raysent.errors import RaysentError
from raysent.tune.plan import SearchPlan, sampler_settings
from raysent.tune.space import encode, suggest

if TYPE_CHECKING:
    import optuna
    from ray.tune.search import Searcher

# Lazy imports: optuna, ray (heavy, and only the functions that need them import them).


class DefineByRun:
    """Optuna's define-by-run space (a picklable callable: Tune checkpoints the searcher)."""

    def __init__(self, space: dict[str, Any]):
        self.space = space

    def __call__(self, trial: optuna.Trial) -> None:
        suggest(trial, self.space)


def sampler_of(cfg: ExperimentConfig) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of ``search.algorithm`` (not grid) with :func:`sampler_settings`' options: optuna-tpe,
    Optuna's multivariate TPESampler with the constant liar; optuna-gp, its GPSampler; random, its RandomSampler.
    ``search.n_startup_trials`` sets the random configurations TPE and GP draw before their model is used (Optuna's
    default otherwise, 10)."""
    import optuna

    settings = sampler_settings(cfg)
    if settings is None:
        raise RaysentError(f"search.algorithm {cfg.search.algorithm if cfg.search else None!r} has no Optuna sampler "
                           "(a grid is Tune's grid_search)")
    options = {k: v for k, v in settings.items() if k != "sampler"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPSampler and constant_liar are experimental in some Optuna versions
        return getattr(optuna.samplers, settings["sampler"])(**options)


def searcher_of(cfg: ExperimentConfig, plan: SearchPlan, exp: Path, run: str, metric: str
                ) -> tuple[Searcher | None, dict[str, Any] | None]:
    """(Tune's search algorithm, param_space): Optuna with the warm-start point first, or a grid."""
    from ray import tune

    s = cfg.search
    assert s is not None
    apart = s.seeds > 1 and not plan.together  # a trial per (configuration, seed)
    if plan.points is not None:
        return None, {"hp": tune.grid_search(plan.points),
                      **({"seed_index": tune.grid_search(list(range(s.seeds)))} if apart else {})}
    import optuna
    from ray.tune.search import Repeater
    from ray.tune.search.optuna import OptunaSearch

    storage = optuna.storages.RDBStorage(f"sqlite:///{exp / 'optuna.db'}")
    searcher = OptunaSearch(space=DefineByRun(s.space), sampler=sampler_of(cfg),
                            study_name=f"search-{run}", storage=storage, metric=metric, mode=s.mode,
                            points_to_evaluate=[encode(plan.warm, s.space)] if plan.warm is not None else None)
    return (Repeater(searcher, repeat=s.seeds, set_index=True) if apart else searcher), None
