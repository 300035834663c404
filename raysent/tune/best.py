"""Choosing a search's best configuration, and summing up a final phase, from the run records; the winner's
``best.yaml`` and the searched configurations' MLflow runs.

The best configuration has the highest mean, over its seeds, of the searched metric (``best_dev_spearman``);
on equal means one that learned (best checkpoint after step 0) wins over one whose every seed kept the
untouched encoder, then the one recorded first, and the search says which and why. A final phase's scores
are each score's mean, sample std (n−1; 0 for one run) and n over the runs that have it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from raysent.config import ExperimentConfig, with_overrides
from raysent.errors import RaysentError
from raysent.tracking import log_configuration
from raysent.train.records import RunRecord, learned, read_record
from raysent.tune.state import ArmOutcome, Best, ConfigScore, FailedTrial, ScoreStat, StoppedTrial
from raysent.tune.protocol import STOPPED_DIR, MlflowTarget


def records(exp: Path, phase: str, run: str, folder: str = "runs") -> list[RunRecord]:
    """The records of one phase of one search, in file order."""
    return [read_record(p) for p in sorted((exp / folder).glob(f"{phase}-{run}-*.json"))]


def by_configuration(recs: list[RunRecord]) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = {}
    for r in recs:
        groups.setdefault(r.config_id, []).append(r)
    return groups


def score(cid: str, recs: list[RunRecord]) -> ConfigScore:
    """A configuration's seeds' mean best dev score."""
    vals = [r.best_dev_spearman for r in recs]
    return ConfigScore(config_id=cid, hp=recs[0].hp, seeds=[r.seed for r in recs],
                       learned=any(learned(r.method, r.best_step) is not False for r in recs),
                       dev_mean=float(np.mean(vals)), dev_std=float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                       n=len(vals))


def pick_best(exp: Path, run: str, mode: str, failed: list[FailedTrial], say=lambda m: None) -> Best:
    """The best configuration of search ``run`` (``mode``: max or min) and what its search did."""
    groups = by_configuration(records(exp, "search", run))
    if not groups:
        raise RaysentError(f"search {run}: no trial finished ({len(failed)} failed); see the errors above and "
                           f"the trial logs under {exp / 'tune'}")
    sign = 1 if mode == "max" else -1
    table = sorted((score(cid, recs) for cid, recs in groups.items()),
                   key=lambda c: (-sign * (c.dev_mean or 0.0), not c.learned))
    top = table[0]
    tied = [c for c in table if c.dev_mean == top.dev_mean]
    if len(tied) > 1:
        why = ("it learned (best checkpoint after step 0) and the others did not"
               if top.learned and not all(c.learned for c in tied) else "it was recorded first")
        say(f"{len(tied)} configurations tie at dev {top.dev_mean:.4f}: {top.config_id} is taken because {why}")
        top = top.model_copy(update={"tie": {"with": [c.config_id for c in tied[1:]], "learned": top.learned}})
    stopped = [StoppedTrial(trial_id=r.trial_id, config_id=r.config_id, hp=r.hp, seed=r.seed,
                            best_dev_spearman=r.best_dev_spearman, at_step=r.stopped.at_step if r.stopped else None)
               for r in records(exp, "search", run, STOPPED_DIR)]
    if stopped:
        say(f"{len(stopped)} trial(s) stopped early by the scheduler: records in {exp / STOPPED_DIR}")
    finished = [r for recs in groups.values() for r in recs]
    return Best(**top.model_dump(), configurations=[top, *table[1:]], failed=failed, stopped=stopped,
                finished_runs=len(finished),
                not_learned_runs=sum(learned(r.method, r.best_step) is False for r in finished),
                diverged_runs=sum(bool(r.diverged) for r in finished))


def final_scores(recs: list[RunRecord]) -> dict[str, ScoreStat]:
    """Every score of the final runs: mean, sample std (n−1; 0 for one run) and n over the runs that have it."""
    out = {}
    for k in sorted({k for r in recs for k in r.scores}):
        vals = [r.scores[k] for r in recs if k in r.scores]
        out[k] = ScoreStat(mean=float(np.mean(vals)), std=float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                           n=len(vals))
    return out


def arm_outcome(recs: list[RunRecord], seeds: list[int], errors: list[str]) -> ArmOutcome:
    """A final phase's outcome from its records (``seeds``: those it was to run)."""
    return ArmOutcome(seeds=[r.seed for r in recs], missing_seeds=sorted(set(seeds) - {r.seed for r in recs}),
                      scores=final_scores(recs), errors=errors,
                      not_learned_seeds=sorted(r.seed for r in recs if learned(r.method, r.best_step) is False),
                      diverged_seeds=sorted(r.seed for r in recs if r.diverged),
                      transductive=any(bool(r.transductive) for r in recs))


def write_best_yaml(cfg: ExperimentConfig, exp: Path, run: str, best: Best) -> Path:
    """``results/<experiment>/best.yaml``: the experiment with the winning configuration applied (no search part),
    which ``raysent tune --final-only --config`` runs again."""
    best_cfg = with_overrides(cfg, best.hp).to_dict()
    best_cfg.pop("search", None)
    where = Path(cfg.tracking.results_dir) / exp.name / "best.yaml"  # as the file names the results folder
    path = exp / "best.yaml"
    path.write_text(f"# best configuration of search {run} (mean dev {best.dev_mean:.2f} over {best.n} seed(s));\n"
                    f"# `raysent tune --final-only --config {where}` re-runs the final phase\n"
                    + yaml.safe_dump(best_cfg, sort_keys=False))
    return path


def log_configurations(cfg: ExperimentConfig, mlflow: MlflowTarget, groups: dict[str, list[RunRecord]],
                       best: Best) -> None:
    """A run per searched configuration in MLflow (its mean and std best dev score), its seeds' runs below it."""
    for c in best.configurations:
        recs = groups[c.config_id]
        log_configuration(mlflow.uri, mlflow.experiment_id, with_overrides(cfg, c.hp), "search", c.hp, c.config_id,
                          {"best_dev_spearman_mean": c.dev_mean, "best_dev_spearman_std": c.dev_std},
                          [r.mlflow_run_id for r in recs if r.mlflow_run_id], mlflow.parent, [r.seed for r in recs])
