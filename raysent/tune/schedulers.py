"""The Tune schedulers that stop a search's configurations early (``search.scheduler``, ``search.pruner``).

:func:`early_stopping` builds what the config asks for: Tune's ``ASHAScheduler`` on the seed mean
(``search.scheduler: {type: asha}``), or :class:`WilcoxonScheduler`, Optuna's WilcoxonPruner over the per-seed
dev scores (``search.pruner: wilcoxon``, :mod:`raysent.tune.wilcoxon`); with either, the
:class:`~raysent.tune.stopped.StoppedTrials` callback records the configurations it stops. Imports Ray.
"""

from __future__ import annotations

from pathlib import Path

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from raysent.config import ExperimentConfig
from raysent.tune.protocol import TrialContext, TrialResult
from raysent.tune.wilcoxon import WilcoxonDecision, point_key


class WilcoxonScheduler(FIFOScheduler):
    """Stops a trial when :class:`~raysent.tune.wilcoxon.WilcoxonDecision` says so. The configurations of the
    search that finished before it was interrupted (``--resume``) are read from their run records (``runs/``) at
    its first result: Tune restores a scheduler as it was created, without what it saw."""

    def __init__(self, metric: str, mode: str, p_threshold: float = 0.1, n_startup_steps: int = 2,
                 exp_dir: str | None = None, run: str | None = None, last: tuple[int, int] | None = None):
        super().__init__()
        self._metric, self._mode = metric, mode
        self.decision = WilcoxonDecision(mode, p_threshold, n_startup_steps, point_key(metric), last=last)
        self.stopped: list[str] = []
        self.exp_dir, self.run, self._read = exp_dir, run, False

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        return True  # metric and mode are the search's, given here

    def _read_records(self) -> None:
        self._read = True
        if not self.exp_dir or not self.run:
            return
        from raysent.train.records import read_record

        by_trial: dict[str, list] = {}
        for p in sorted((Path(self.exp_dir) / "runs").glob(f"search-{self.run}-*.json")):
            rec = read_record(p)
            by_trial.setdefault(rec.trial_id or rec.config_id, []).append(rec)
        for tid, recs in by_trial.items():
            self.decision.observe_curves(tid, {r.seed: [pt.model_dump() for pt in r.dev_curve] for r in recs})
            self.decision.finish(tid, sum(r.best_dev_spearman for r in recs) / len(recs))

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if not self._read:
            self._read_records()
        reported = TrialResult.from_tune(result, read_records=False)
        if reported.seed_points is None or reported.finished:
            return TrialScheduler.CONTINUE
        self.decision.observe(trial.trial_id, reported.seed_points)
        if self.decision.should_stop(trial.trial_id):
            self.stopped.append(trial.trial_id)
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        reported = TrialResult.from_tune(result, read_records=False)
        value = reported.value(self._metric) if self._metric else None
        if reported.sent and value is not None:
            self.decision.finish(trial.trial_id, value)

    def debug_string(self) -> str:
        return (f"WilcoxonPruner (Optuna) over per-seed dev scores: {len(self.stopped)} stopped, "
                f"{len(self.decision.finished_values)} finished")


def last_evaluation(cfg: ExperimentConfig) -> tuple[int, int] | None:
    """(stage, step) of a run's last evaluation: its last stage's ``train.max_steps`` (None: given in epochs)."""
    from raysent.methods.spec import get_spec

    stages = len(get_spec(cfg.method).stages(cfg) or ()) or 1  # None: one stage
    return (stages - 1, cfg.train.max_steps) if cfg.train.max_steps else None


def early_stopping(cfg: ExperimentConfig, ctx: TrialContext, metric: str) -> tuple[TrialScheduler | None, list]:
    """(Tune's scheduler, the callbacks it needs) for ``search.scheduler`` or ``search.pruner``; (None, [])."""
    from ray.tune.schedulers import ASHAScheduler

    from raysent.tune.stopped import StoppedTrials

    s = cfg.search
    assert s is not None
    if s.scheduler is not None:
        return (ASHAScheduler(time_attr="training_iteration", metric=metric, mode=s.mode,
                              grace_period=s.scheduler.grace_period, reduction_factor=s.scheduler.reduction_factor,
                              max_t=s.scheduler.max_t or 10**6), [StoppedTrials(ctx)])
    if s.pruner is not None:
        return (WilcoxonScheduler(metric, s.mode, s.pruner.p_threshold, s.pruner.n_startup_steps,
                                  exp_dir=ctx.exp_dir, run=ctx.run, last=last_evaluation(cfg)), [StoppedTrials(ctx)])
    return None, []
