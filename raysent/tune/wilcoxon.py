"""``search.pruner: wilcoxon``: Optuna's WilcoxonPruner stops configurations, deciding inside a Ray Tune scheduler.

A configuration's trial trains its seeds in turns and, after every round of evaluations, reports each seed's dev
score (``seed_points``, :mod:`raysent.tune.seeds`). Each (seed, stage, step) is one *instance* in the sense of
:class:`optuna.pruners.WilcoxonPruner`: the trial "reports" the seed's dev score at that evaluation under that
instance's id, and after each round the pruner runs its one-sided Wilcoxon signed-rank test of those scores
against the same instances of the best configuration that ran to its end, and the trial stops when p is below
``p_threshold`` (Optuna's decision, with its ``n_startup_steps`` and its "not while the average is better"
safety). Step 0 is left out: it is the untouched encoder, the same for every configuration of a seed.

Why a scheduler: Ray Tune's ``OptunaSearch`` creates its study with ``optuna.pruners.NopPruner`` and takes no
pruner (ray 2.60, ``ray/tune/search/optuna/optuna_search.py``, ``_setup_study``), and only a Tune scheduler can
stop a running trial. So the scheduler keeps the per-seed scores of every configuration and asks
``WilcoxonPruner.prune`` with an in-memory Optuna study of the configurations that finished (the best of them is
``study.best_trial``, ranked by the seed mean the searcher is told). A stopped configuration is recorded like one
ASHA stops (``stopped/``, :mod:`raysent.tune.stopped`), and the searcher is told its seed mean so far.

The decision is :class:`WilcoxonDecision` (plain data, no Ray: tested on its own against Optuna's pruner);
the Tune scheduler around it is :class:`raysent.tune.schedulers.WilcoxonScheduler`.

The pairs are not independent (the same seed's scores at successive steps move together), so the test's p is
optimistic; the pruner is a rule for stopping, not a significance claim (docs/search.md).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

from raysent.tune.protocol import BEST, DEV, STEP


def point_key(metric: str) -> str:
    """The per-seed score of an evaluation that stands for the search's metric (``best_dev_spearman``: the dev
    score at that evaluation, ``dev_spearman``; ``dev/<set>``: that set's)."""
    return DEV if metric == BEST else metric


class WilcoxonDecision:
    """The pruner's state as plain data (Tune may save it with the experiment): each configuration's per-instance
    scores, and the seed mean of each configuration that finished."""

    def __init__(self, mode: str, p_threshold: float = 0.1, n_startup_steps: int = 2, key: str = DEV,
                 last: tuple[int, int] | None = None):
        self.mode, self.p_threshold, self.n_startup_steps, self.key = mode, p_threshold, n_startup_steps, key
        self.last = last  # (stage, step) of a run's last evaluation: stopping there saves nothing
        self.instances: dict[str, int] = {}  # "<seed>/<stage>/<step>": Optuna's instance id ("step")
        self.values: dict[str, dict[int, float]] = {}  # by trial: {instance: score}
        self.finished_values: dict[str, float] = {}  # trials that ran to their end: their seed mean
        self._stage: dict[str, dict[str, tuple[int, int]]] = {}  # by trial, by seed: (stage, last step)

    def observe(self, trial_id: str, points: dict[str, dict[str, Any]]) -> None:
        """A round's per-seed points (``seed_points``): {seed: {step, dev_spearman, dev/<set>, ...}}."""
        for seed, p in points.items():
            if STEP not in p:
                continue
            step = int(p[STEP])
            stage, last = self._stage.setdefault(trial_id, {}).get(seed, (0, -1))
            if step < last:  # a multi-stage run's next stage starts again at step 0
                stage += 1
            self._stage[trial_id][seed] = (stage, step)
            if step == 0 or p.get(self.key) is None:
                continue
            inst = self.instances.setdefault(f"{seed}/{stage}/{step}", len(self.instances))
            self.values.setdefault(trial_id, {})[inst] = float(p[self.key])

    def observe_curves(self, trial_id: str, curves: dict[int, Iterable[dict[str, Any]]]) -> None:
        """A configuration's whole per-seed dev curves ({seed: [points]}), as if reported round by round."""
        lists = {str(s): list(c) for s, c in curves.items()}
        for i in range(max((len(c) for c in lists.values()), default=0)):
            self.observe(trial_id, {s: c[i] for s, c in lists.items() if i < len(c)})

    def finish(self, trial_id: str, value: float) -> None:
        """A configuration ran to its end with seed mean ``value``: a candidate for the best."""
        if math.isfinite(value):
            self.finished_values[trial_id] = float(value)

    def at_end(self, trial_id: str) -> bool:
        """Whether every seed of the configuration has reached its run's last evaluation (``last``)."""
        seen = self._stage.get(trial_id) or {}
        return self.last is not None and bool(seen) and all(v == self.last for v in seen.values())

    def should_stop(self, trial_id: str) -> bool:
        """WilcoxonPruner's decision for the configuration now, against the best finished one (never at its last
        evaluation, where stopping saves nothing and would leave its runs unfinished)."""
        import optuna
        from optuna.trial import TrialState, create_trial

        values = self.values.get(trial_id)
        if not values or not self.finished_values or self.at_end(trial_id):
            return False
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in memory", each time
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExperimentalWarning; the pruner's own notes on NaN scores
                pruner = optuna.pruners.WilcoxonPruner(p_threshold=self.p_threshold,
                                                       n_startup_steps=self.n_startup_steps)
                study = optuna.create_study(direction="maximize" if self.mode == "max" else "minimize")
                for tid, value in self.finished_values.items():
                    study.add_trial(create_trial(state=TrialState.COMPLETE, value=value,
                                                 intermediate_values=self.values.get(tid, {})))
                return bool(pruner.prune(study, create_trial(state=TrialState.RUNNING, intermediate_values=values)))
        finally:
            optuna.logging.set_verbosity(verbosity)
